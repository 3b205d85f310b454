"""Dynamic sampling and overlong shaping on the driver (rlgen.runtime.step.score), with stand-ins for the engines and
the scorer: groups whose rewards are all equal never reach the batch, the batch is refilled to full from further
rounds, and the cap on rounds holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from helpers import algo_cfg
from rlgen.runtime.step.score import shape_and_refill, shaped_rewards
from rlgen.tasks.scoring import Scores
from rlgen.types import Completion, StepTimeline

G = 4  # samples per prompt


def _group(gid: int, rewards: list[float], length: int = 3) -> list[tuple[Completion, float]]:
    return [(Completion(gid, [1, 2], [5] * length, [-0.1] * length, "stop", 0), r) for r in rewards]


@dataclass
class FakeFlight:
    prepared: list[Completion]
    scoring: Scores
    results: dict = field(default_factory=dict)
    resolved: Any = None  # a flight whose groups partial rollouts sorted out (InFlight.resolved)


class FakeRollouts:
    """Round r of a step gives groups whose rewards come from `plan[r]` (one reward list per group)."""

    def __init__(self, plan: list[list[list[float]]]):
        self.plan, self.asked = plan, []
        self.scorer = SimpleNamespace(result=lambda scoring: scoring)

    def extra_flight(self, step, round, n, version):
        self.asked.append(n)
        pairs = [p for gid, rewards in enumerate(self.plan[round][:n]) for p in _group(gid, rewards)]
        return FakeFlight([c for c, _ in pairs], Scores([r for _, r in pairs], {"r": [r for _, r in pairs]}))

    def collect(self, flight):
        pass

    def prepare(self, flight):
        pass


def _run(plan, **algo):
    cfg = SimpleNamespace(algo=algo_cfg(samples_per_prompt=G, **algo))
    ro = FakeRollouts(plan)
    built = SimpleNamespace(rollouts=ro, transport=SimpleNamespace(version=0), engine_names=["engine0"])
    run = SimpleNamespace(cfg=cfg, built=built)
    first = ro.extra_flight(0, 0, len(plan[0]), 0)
    ro.asked.clear()
    return shape_and_refill(run, 0, first, first.scoring, StepTimeline(0)), ro


CONST, MIXED = [1.0] * G, [0.0, 1.0, 0.0, 1.0]


def _groups_of(got) -> list[list[float]]:
    by: dict[int, list[float]] = {}
    for c, r in zip(got.completions, got.rewards):
        by.setdefault(c.group_id, []).append(r)
    return [by[g] for g in sorted(by)]


def test_constant_groups_are_dropped_and_the_batch_refilled():
    plan = [[CONST, MIXED, [0.0] * G, MIXED], [MIXED, CONST, MIXED, MIXED]]
    got, ro = _run(plan, prompts_per_step=4, dynamic_sampling=True, max_gen_batches=3)
    groups = _groups_of(got)
    assert len(groups) == 4 and all(len(set(g)) > 1 for g in groups)  # full, and no constant group
    assert sorted(c.group_id for c in got.completions) == sorted(g for g in range(4) for _ in range(G))
    assert got.metrics["dynamic/rounds"] == 2 and got.metrics["dynamic/groups_kept"] == 4
    assert got.metrics["dynamic/groups_dropped"] == 2 + (1 if ro.asked[0] >= 2 else 0)
    assert got.metrics["dynamic/extra_tokens"] == 3 * G * ro.asked[0]
    assert len(got.scores.totals) == G * (4 + ro.asked[0])  # every generated completion is scored and counted


def test_the_cap_on_rounds_holds_and_a_short_batch_trains():
    plan = [[CONST, MIXED], [CONST, CONST], [CONST, CONST], [MIXED, MIXED]]
    got, ro = _run(plan, prompts_per_step=2, dynamic_sampling=True, max_gen_batches=3)
    assert len(ro.asked) == 2  # rounds 1 and 2; round 3 would pass the cap
    assert got.metrics["dynamic/groups_kept"] == 1 and len(_groups_of(got)) == 1


def test_no_informative_group_falls_back_to_the_first_round():
    plan = [[CONST, CONST], [CONST, CONST]]
    got, _ = _run(plan, prompts_per_step=2, dynamic_sampling=True, max_gen_batches=2)
    assert got.metrics["dynamic/groups_kept"] == 0
    assert len(got.completions) == 2 * G  # the first round, whose advantages are all 0


def test_without_dynamic_sampling_nothing_is_dropped():
    plan = [[CONST, MIXED]]
    got, ro = _run(plan, prompts_per_step=2)
    assert ro.asked == [] and len(got.completions) == 2 * G and "dynamic/rounds" not in got.metrics


def test_overlong_penalty_shapes_rewards_and_can_make_a_group_informative():
    # max_new_tokens 8, buffer 4: a response of 6 tokens loses 0.5 * penalty, one of 8 the whole penalty
    comps = [Completion(0, [1], [5] * n, [-0.1] * n, "length" if n == 8 else "stop", 0) for n in (4, 6, 8)]
    rewards, pen = shaped_rewards(comps, [1.0, 1.0, 1.0], algo_cfg(overlong_buffer=4, overlong_penalty=0.5))
    assert pen == pytest.approx([0.0, -0.25, -0.5])
    assert rewards == pytest.approx([1.0, 0.75, 0.5])


def test_truncated_responses_leave_the_loss_with_mask_truncated():
    from rlgen.runtime.rollouts.batch import build_batch

    comps = [Completion(0, [1], [5, 6], [-0.1, -0.2], reason, 0) for reason in ("stop", "length", "stop", "length")]
    masked = build_batch(comps, [1.0, 0.0, 1.0, 0.0], 0, mask_truncated=True)
    kept = build_batch(comps, [1.0, 0.0, 1.0, 0.0], 0)
    assert masked.response_mask.sum(dim=-1).tolist() == [2.0, 0.0, 2.0, 0.0]
    assert kept.response_mask.sum(dim=-1).tolist() == [2.0, 2.0, 2.0, 2.0]
    # their rewards stay in the batch for their groups' advantages (test_step_advantages)
    assert masked.rewards.tolist() == kept.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
