"""Score: the step's completions decoded, checked and scored, their rewards shaped by the response length (DAPO's
overlong penalty), and, with dynamic sampling, groups whose rewards are all equal dropped and replaced by groups of
more prompts, generated in further rounds until the batch is full or algo.max_gen_batches rounds have run. The
completions kept are padded into the batch's rows; their advantages come next (``runtime.step.advantages``).

Every completion generated is scored and counted in the step's reward metrics (they all come from the current
policy); only the kept groups are trained on. The extra rounds' generation goes on the step's timeline, so the
balancer counts it as generation work."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.markup import escape

from rlgen.runtime.errors import RunError
from rlgen.runtime.rollouts.in_flight import InFlight
from rlgen.runtime.run_handle import Run
from rlgen.runtime.step.generate import Generated
from rlgen.tasks.scoring import RewardError, Scores
from rlgen.types import Completion, Phase, RolloutBatch, StepTimeline

if TYPE_CHECKING:
    from rlgen.config import AlgoConfig

log = logging.getLogger(__name__)


@dataclass
class Scored:
    """The score phase's result: the rows to train on and what the step's record takes from the scoring."""

    rows: RolloutBatch  # sorted by group, with the shaped rewards; the advantages phase fills in their advantages
    scores: Scores  # every completion generated this step (all rounds)
    metrics: dict[str, float]  # reward/* means, then shaping, dynamic sampling, episodes, partial rollouts, tail


@dataclass
class Shaped:
    """The completions to train on with the rewards their advantages come from, after dynamic sampling's refill."""

    completions: list[Completion]  # to train on, group ids 0 .. groups-1
    rewards: list[float]  # the rewards the advantages come from (shaped), one per completion
    scores: Scores  # every completion generated this step (all rounds)
    penalties: list[float]  # the overlong penalty of every completion generated (all rounds)
    metrics: dict[str, float] = field(default_factory=dict)


def score(run: Run, step: int, generated: Generated, tl: StepTimeline) -> Scored:
    """The step's flight prepared and scored (the driver's reward spans on the timeline), shaped and refilled, and
    padded into rows; says when rewards came back NaN, an environment failed, or the batch could not be filled."""
    built = run.built
    from rlgen.runtime.rollouts.batch import build_batch

    flight, algo = generated.flight, run.cfg.algo
    t0 = time.time()
    try:
        built.rollouts.prepare(flight)
        scores = built.rollouts.scorer.result(flight.scoring)
    except RewardError as err:
        raise RunError(str(err)) from err
    t1 = time.time()
    tl.add("driver", Phase.reward, t0, t1)
    got = shape_and_refill(run, step, flight, scores, tl)
    got.metrics.update(generated.tail)
    t0 = time.time() if got.metrics.get("dynamic/rounds", 1) > 1 else t1  # the extra rounds' scoring is inside them
    rows = build_batch(got.completions, got.rewards, built.pad_id, mask_truncated=algo.mask_truncated)
    tl.add("driver", Phase.reward, t0, time.time())
    _warn_rewards(run, step, got, flight)
    return Scored(rows, got.scores, {**got.scores.means(), **got.metrics})


def shaped_rewards(completions: list[Completion], totals: list[float], algo: AlgoConfig) -> tuple[list[float], list[float]]:
    """(the rewards plus the overlong penalty, the penalties), one per completion."""
    if not algo.overlong_buffer:
        return list(totals), [0.0] * len(totals)
    import torch

    from rlgen.algo.advantages import overlong_penalty

    lengths = torch.tensor([sum(c.loss_mask) if c.loss_mask else len(c.token_ids) for c in completions],
                           dtype=torch.float32)  # the policy's tokens (an episode's environment's are not)
    pen = overlong_penalty(lengths, algo.max_new_tokens, algo.overlong_buffer, algo.overlong_penalty).tolist()
    return [t + p for t, p in zip(totals, pen)], pen


def _groups(completions: list[Completion], rewards: list[float]) -> list[tuple[list[Completion], list[float]]]:
    """The completions and rewards of each group, in group order."""
    by: dict[int, tuple[list[Completion], list[float]]] = {}
    for c, r in zip(completions, rewards):
        got = by.setdefault(c.group_id, ([], []))
        got[0].append(c)
        got[1].append(r)
    return [by[g] for g in sorted(by)]


def _informative(completions: list[Completion], rewards: list[float]) -> list[tuple[list[Completion], list[float]]]:
    """The groups (as _groups gives them) that have two different finite rewards: the ones with a signal."""
    import torch

    from rlgen.algo.advantages import informative_groups

    keep = informative_groups(torch.tensor(rewards, dtype=torch.float32),
                              torch.tensor([c.group_id for c in completions])).tolist()
    kept = {c.group_id for c, k in zip(completions, keep) if k}
    return [g for g in _groups(completions, rewards) if g[0][0].group_id in kept]


def shape_and_refill(run: Run, step: int, flight: InFlight, scores: Scores, tl: StepTimeline) -> Shaped:
    """The step's first round (flight, scored), shaped, and refilled when algo.dynamic_sampling is on."""
    algo = run.cfg.algo
    rewards, pen = shaped_rewards(flight.prepared, scores.totals, algo)
    got = _refilled(run, step, flight, scores, rewards, pen, tl) if algo.dynamic_sampling else \
        Shaped(flight.prepared, rewards, scores, pen)
    if algo.overlong_buffer:  # over every completion generated
        got.metrics["reward/overlong_penalty"] = sum(got.penalties) / max(len(got.penalties), 1)
    if algo.mask_truncated:  # of those trained on
        got.metrics["truncated_masked"] = float(sum(c.finish_reason == "length" for c in got.completions))
    if any(c.turns for c in flight.prepared):
        got.metrics.update(episode_metrics(flight))
    if flight.resolved is not None:  # algo.partial_rollouts: the groups cut short and carried on
        got.metrics.update(flight.resolved.metrics)
    return got


def episode_metrics(flight: InFlight) -> dict[str, float]:
    """A multi-turn step's episodes (the first round's): the policy's turns and the environment's tokens per
    episode, the episodes an environment ended with an error (of which those whose call ran past
    task.env_timeout_s: env/timeouts), and the longest engine's time in environment calls."""
    comps = flight.prepared
    n = max(len(comps), 1)
    return {"env/turns": sum(c.turns for c in comps) / n,
            "env/tokens": sum(len(c.loss_mask) - sum(c.loss_mask) for c in comps) / n,
            "env/errors": float(sum(bool(c.env_error) for c in comps)),
            "env/timeouts": float(sum(c.env_timed_out for c in comps)),
            "env_s": max((r.env_s for r in flight.results.values()), default=0.0)}


def _refilled(run: Run, step: int, flight: InFlight, scores: Scores, rewards: list[float], pen: list[float],
              tl: StepTimeline) -> Shaped:
    """Dynamic sampling: the first round's informative groups, then more rounds until the batch is full."""
    algo = run.cfg.algo
    metrics: dict[str, float] = {}
    want = algo.prompts_per_step
    kept = _informative(flight.prepared, rewards)
    generated, extra_tokens, rounds = len({c.group_id for c in flight.prepared}), 0, 1
    while len(kept) < want and rounds < algo.max_gen_batches:
        need = want - len(kept)
        rate = len(kept) / generated
        n = want if rate == 0 else min(want, max(need, math.ceil(1.2 * need / rate)))
        more = _round(run, step, rounds, n, tl)
        scores = scores + more.scores
        pen = pen + more.penalties
        extra_tokens += sum(len(c.token_ids) for c in more.completions)
        kept += _informative(more.completions, more.rewards)
        generated += len({c.group_id for c in more.completions})
        rounds += 1
    metrics.update({"dynamic/groups_dropped": float(generated - len(kept)), "dynamic/rounds": float(rounds),
                    "dynamic/extra_tokens": float(extra_tokens), "dynamic/groups_kept": float(min(len(kept), want)),
                    "dynamic/groups_surplus": float(max(len(kept) - want, 0))})
    if not kept:  # nothing to learn from this step: train on the first round (its advantages are all 0)
        metrics["dynamic/groups_kept"] = 0.0
        return Shaped(flight.prepared, rewards, scores, pen, metrics)
    comps, out_rewards = [], []
    for gid, (cs, rs) in enumerate(kept[:want]):
        comps += [dataclasses.replace(c, group_id=gid) for c in cs]
        out_rewards += rs
    return Shaped(comps, out_rewards, scores, pen, metrics)


def _round(run: Run, step: int, round: int, n: int, tl: StepTimeline) -> Shaped:
    """One more generation round of n prompts: generated, scored, shaped (not refilled)."""
    built = run.built

    ro = built.rollouts
    flight = ro.extra_flight(step, round, n, built.transport.version)
    ro.collect(flight)
    for i, res in flight.results.items():
        tl.add_spans(built.engine_names[i], res.spans)
    try:
        ro.prepare(flight)
        scores = ro.scorer.result(flight.scoring)
    except RewardError as err:
        raise RunError(str(err)) from err
    rewards, pen = shaped_rewards(flight.prepared, scores.totals, run.cfg.algo)
    return Shaped(flight.prepared, rewards, scores, pen)


def _timeouts_by_engine(flight: InFlight) -> tuple[list[int], float]:
    """The episodes whose environment call ran past task.env_timeout_s, on each engine, and the longest engine's
    generate() call in seconds."""
    counts = [sum(c.env_timed_out for c in r.completions) for r in flight.results.values()]
    calls = [max(b for _, _, b in r.spans) - min(a for _, a, _ in r.spans) for r in flight.results.values() if r.spans]
    return counts, max(calls, default=0.0)


TIMEOUTS_LONG = 0.1  # timeouts that cost this share of a step's generation made it long


def timeouts_sentence(step: int, per_engine: list[int], gen_s: float, env_timeout_s: float,
                      env_workers: int) -> str | None:
    """What the step's environment timeouts cost, where that made its generation long (TIMEOUTS_LONG of it), with
    the settings that shorten it; None otherwise. Each held one of an engine's task.env_workers for
    task.env_timeout_s: the engine with the most waited at least ceil(its timeouts / env_workers) x that."""
    most = max(per_engine, default=0)
    cost = -(-most // max(1, env_workers)) * env_timeout_s
    if not most or cost < TIMEOUTS_LONG * gen_s:
        return None
    return (f"step {step}: {sum(per_engine)} episodes' environment calls ran past task.env_timeout_s="
            f"{env_timeout_s:g} s and were killed; waiting for them took at least {cost:.0f} s of the step's "
            f"{gen_s:.0f} s of generation ({most} on one engine, task.env_workers={env_workers} at a time). Lower "
            "task.env_timeout_s, raise task.env_workers, or raise timeout_s if steps run past it (env/timeouts counts "
            "them each step).")


def _warn_rewards(run: Run, step: int, got: Shaped, flight: InFlight) -> None:
    """Say when rewards came back NaN (they were given advantage 0), an environment failed or its timeouts made
    the step long, or dynamic sampling could not fill the batch."""
    services = run.services
    built = run.built
    nan = got.scores.nan_count
    if nan:
        services.sink.console.print(f"[yellow]reward:[/] step {step}: {nan} of {len(got.scores.totals)} rewards were NaN; "
                                    "those completions get advantage 0 (reward/nan counts them).", highlight=False)
    errors = [c.env_error for c in got.completions if c.env_error]
    for c in got.completions:
        if c.env_error:
            log.info("step %d, group %d: the episode scored 0: %s", step, c.group_id, c.env_error)
    if errors and not built.rollouts.said_env_error:  # once per run; env/errors counts them every step
        built.rollouts.said_env_error = True
        services.sink.console.print(f"[yellow]environment:[/] step {step}: {len(errors)} episodes ended with an error and "
                                    f"scored 0, the first: {escape(errors[0])} (env/errors counts them each step, "
                                    "env/timeouts those whose call ran past task.env_timeout_s; run.log has each).",
                                    highlight=False)
    if got.metrics.get("env/timeouts") and not built.rollouts.said_env_timeouts:
        t = run.cfg.task
        said = timeouts_sentence(step, *_timeouts_by_engine(flight), t.env_timeout_s, t.env_workers)
        if said:  # once per run, when they made a step long; env/timeouts counts them every step
            built.rollouts.said_env_timeouts = True
            services.sink.console.print(f"[yellow]environment:[/] {said}", highlight=False)
    want = run.cfg.algo.prompts_per_step
    kept = got.metrics.get("dynamic/groups_kept")
    if kept is not None and kept < want:
        services.sink.console.print(
            f"[yellow]dynamic sampling:[/] step {step} kept {kept:.0f} of {want} groups after "
            f"algo.max_gen_batches={run.cfg.algo.max_gen_batches} rounds (the others' rewards were all equal); it "
            "trained on those. Raise algo.max_gen_batches, or use a task whose prompts are neither all solved nor "
            "all failed.", highlight=False)


__all__ = ["Scored", "Shaped", "episode_metrics", "score", "shape_and_refill", "shaped_rewards"]
