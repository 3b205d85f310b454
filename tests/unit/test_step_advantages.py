"""The step's advantages phase (rlgen.runtime.step.advantages), with stand-in learners and algorithm: the
advantages are computed once per step, also with algo.kl_penalty=reward, where they are the algorithm's advantages
of the rewards less kl_coef times the learners' sequence KL; an advantages function of the wrong shape is refused
in a sentence."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers import algo_cfg
from rlgen.algo.advantages import grpo_advantages
from rlgen.mesh import LearnerMesh
from rlgen.runtime.cluster.learner_group import LearnerGroup
from rlgen.runtime.errors import RunError
from rlgen.runtime.rollouts.batch import build_batch
from rlgen.runtime.step.advantages import advantages, computed_advantages
from rlgen.runtime.step.score import Scored
from rlgen.tasks.scoring import Scores
from rlgen.types import Completion

REWARDS = [1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25]  # two groups of four


def _completions() -> list[Completion]:
    # row i's response is i + 1 tokens of id 10 + i: the stand-in learner's KL of a row is read off its tokens
    return [Completion(i // 4, [1, 2], [10 + i] * (i + 1), [-0.1] * (i + 1), "stop", 0) for i in range(8)]


class CountingAlgorithm:
    """GRPO's advantages, counting the calls."""

    def __init__(self):
        self.calls = 0

    def advantages(self, rewards, group_ids, algo):
        self.calls += 1
        return grpo_advantages(rewards, group_ids, algo)


class StandInLearner:
    """sequence_kl of a shard: each row's KL is a tenth of its first response token id (10 + its row)."""

    def __init__(self):
        self.sequence_kl = SimpleNamespace(remote=self._kl)
        self.shards = []

    def _kl(self, shard):
        """From the token batch the driver packed (rlgen.learners.token_batch): each row's first response token,
        the target its packed micro-batch puts in column 0 of the row."""
        self.shards.append(shard)
        first_token = {}
        for rows, packed in zip(shard.micro_rows, shard.packs):
            at_start = packed.slot % packed.resp_len == 0
            for slot, token in zip(packed.slot[at_start].tolist(), packed.targets[at_start].tolist()):
                first_token[int(rows[slot // packed.resp_len])] = token
        return [first_token[r] / 10 for r in range(shard.n_rows)]


def _run(ranks: int = 2, **algo):
    learners = [StandInLearner() for _ in range(ranks)]
    cfg = SimpleNamespace(algo=algo_cfg(samples_per_prompt=4, **algo),
                          model=SimpleNamespace(num_layers=2, hidden_size=32))
    mesh = LearnerMesh(len(learners))
    waiter = SimpleNamespace(learner_get=lambda refs, what, names, nodes, hang_s=None: refs)
    return SimpleNamespace(cfg=cfg, plan=SimpleNamespace(model=SimpleNamespace(params=10_000), mesh=mesh),
                           built=SimpleNamespace(learners=learners, algorithm=CountingAlgorithm()),
                           learner_group=LearnerGroup(learners, mesh, waiter, [], 1.0), state=SimpleNamespace(version=3))


def _scored() -> Scored:
    rows = build_batch(_completions(), REWARDS, 0)
    return Scored(rows, Scores(list(REWARDS), {"r": list(REWARDS)}), {})


def test_kl_in_the_reward_comes_off_the_rewards_before_the_one_computation_of_the_advantages():
    run = _run(kl_coef=0.5, kl_penalty="reward")
    batch = advantages(run, 7, _scored())
    assert run.built.algorithm.calls == 1  # once per step
    assert sum(len(learner.shards) for learner in run.built.learners) == 2  # every rank gave the KL of its rows
    kl = torch.tensor([(10 + i) / 10 for i in range(8)])  # the batch's rows are in group order already
    want_rewards = torch.tensor(REWARDS) - 0.5 * kl
    assert torch.allclose(batch.rows.rewards, want_rewards)
    want = grpo_advantages(want_rewards, torch.tensor([i // 4 for i in range(8)]), run.cfg.algo)
    assert torch.allclose(batch.rows.advantages, want) and batch.rows.advantages.dtype == torch.float32
    assert not torch.allclose(want, grpo_advantages(torch.tensor(REWARDS), batch.rows.group_ids, run.cfg.algo))
    tokens = sum(i + 1 for i in range(8))
    assert batch.metrics["kl"] == pytest.approx(float(kl.sum()) / tokens)
    assert batch.metrics["kl_reward_penalty"] == pytest.approx(0.5 * float(kl.mean()))
    assert batch.staleness == 3 and sorted(r for rank in range(2) for r in batch.assignment.rows(rank)) == list(
        range(8))


@pytest.mark.parametrize("algo", [{}, {"kl_coef": 0.5, "kl_penalty": "loss"}, {"kl_coef": 0.0, "kl_penalty": "reward"}])
def test_without_kl_in_the_reward_the_advantages_are_the_rewards_own_computed_once(algo):
    run = _run(**algo)
    batch = advantages(run, 0, _scored())
    assert run.built.algorithm.calls == 1 and batch.metrics == {}
    assert all(not learner.shards for learner in run.built.learners)  # no KL asked of the learners
    assert torch.allclose(batch.rows.rewards, torch.tensor(REWARDS))
    want = grpo_advantages(torch.tensor(REWARDS), torch.tensor([i // 4 for i in range(8)]), run.cfg.algo)
    assert torch.allclose(batch.rows.advantages, want) and bool(want.abs().sum() > 0)


def test_advantages_of_the_wrong_length_get_a_sentence():
    run = _run()
    run.built.algorithm = SimpleNamespace(advantages=lambda r, g, algo: torch.zeros(5))
    with pytest.raises(RunError, match=r"algo.advantage=grpo: the algorithm's advantages have shape \[5\] for a batch "
                                       r"of 8 completions; .* shape \[8\]"):
        computed_advantages(run, _scored().rows)


def test_truncated_responses_keep_their_place_in_their_groups_advantages():
    comps = [Completion(0, [1], [5, 6], [-0.1, -0.2], reason, 0) for reason in ("stop", "length", "stop", "length")]
    run = _run()
    masked = computed_advantages(run, build_batch(comps, [1.0, 0.0, 1.0, 0.0], 0, mask_truncated=True))
    kept = computed_advantages(run, build_batch(comps, [1.0, 0.0, 1.0, 0.0], 0))
    assert masked.tolist() == kept.tolist() and bool(masked.abs().sum() > 0)  # the group's advantages count them
