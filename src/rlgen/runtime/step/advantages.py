"""Advantages: the one place a step's advantages are computed, by the algorithm (algo.advantage), over the whole
batch before it is sharded. With algo.kl_penalty=reward (and algo.kl_coef > 0) the learners first give each
sequence's summed KL to the reference, and kl_coef times it comes off the sequence's reward; the advantages then
come from those rewards. Under on-policy distillation the teacher's per-token term joins them (runtime.step.teacher)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlgen.config import DistillEstimator, KLPenalty
from rlgen.microbatches import Assignment
from rlgen.runtime.errors import RunError
from rlgen.runtime.run_handle import Run
from rlgen.runtime.step.score import Scored
from rlgen.runtime.step.shards import assign_rows, shards, with_advantages
from rlgen.runtime.step.teacher import teacher_terms
from rlgen.types import RolloutBatch, StepTimeline

if TYPE_CHECKING:
    import torch

    from rlgen.learners.token_batch import TokenBatch


@dataclass
class Batch:
    """What the learners train on: the step's rows with their advantages, and each data rank's token batch."""

    rows: RolloutBatch  # with the step's advantages (and, for kl_penalty=reward, the rewards less the KL penalty)
    assignment: Assignment  # which rows each learner rank trains on (runtime.step.shards)
    shards: list[TokenBatch]  # each data rank's rows, packed once, with their advantages
    staleness: int  # the learner's version less the oldest version that sampled the rows
    metrics: dict[str, float]  # kl and kl_reward_penalty with algo.kl_penalty=reward; distill/* with a teacher


def advantages(run: Run, step: int, scored: Scored, tl: StepTimeline | None = None) -> Batch:
    """The scored rows with their advantages, computed once (after the KL penalty where the rewards carry it).
    Under on-policy distillation (algo.teacher) each token's advantage is (1 - distill_coef) times its row's plus
    the teacher's term (runtime.step.teacher), whose spans go on tl; with algo.distill_estimator=full the teacher's
    term is in the learners' loss instead."""
    algo, rows = run.cfg.algo, scored.rows
    assignment = assign_rows(run, rows)
    packed = shards(rows, assignment, run.plan.mesh)  # once: the KL phase and the train phase take these
    metrics: dict[str, float] = {}
    if algo.kl_coef > 0 and KLPenalty(algo.kl_penalty) is KLPenalty.reward:
        kl = _sequence_kl(run, step, packed, assignment)
        rows.rewards = rows.rewards - algo.kl_coef * kl
        metrics = {"kl": float(kl.sum()) / max(rows.num_response_tokens, 1),
                   "kl_reward_penalty": float(algo.kl_coef * kl.mean())}
    rows.advantages = computed_advantages(run, rows)
    terms = None
    if algo.teacher:
        from rlgen.algo.distill import task_share

        rows.advantages = task_share(rows.advantages, algo.distill_coef)
        if DistillEstimator(algo.distill_estimator) is DistillEstimator.sampled:  # full: in the learners' loss
            taught = teacher_terms(run, step, packed, tl if tl is not None else StepTimeline(step))
            terms, metrics = taught.terms, {**metrics, **taught.metrics}
    return Batch(rows, assignment, with_advantages(packed, rows, assignment, terms), run.state.version - rows.version,
                 metrics)


def computed_advantages(run: Run, rows: RolloutBatch) -> torch.Tensor:
    """The algorithm's advantages of the rows' rewards within their groups, [N] float32; an advantages function
    that gives another shape is refused in a sentence naming algo.advantage."""
    import torch

    from rlgen.algo.loss import AdvantageShapeError

    algo, n = run.cfg.algo, rows.num_sequences
    adv = run.built.algorithm.advantages(rows.rewards, rows.group_ids, algo)
    if getattr(adv, "shape", None) != (n,):
        err = AdvantageShapeError(
            f"the algorithm's advantages have shape {list(getattr(adv, 'shape', []))} for a batch of {n} completions; "
            f"an advantages function must return one value per completion, shape [{n}].")
        raise RunError(f"algo.advantage={algo.advantage}: {err}") from err
    return adv.to(torch.float32)


def _sequence_kl(run: Run, step: int, packed: list[TokenBatch], assignment: Assignment) -> torch.Tensor:
    """Each row's summed KL to the reference, from the learner ranks that will train on it: [N], in row order."""
    import torch

    group = run.learner_group
    per_rank = group.wait(group.ask("sequence_kl", packed), f"the reference KL of step {step}", hang=False)
    return torch.tensor(assignment.gather(group.leads(per_rank)), dtype=torch.float32)


__all__ = ["Batch", "advantages", "computed_advantages"]
