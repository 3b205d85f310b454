"""On-policy distillation's phase (algo.teacher): each learner rank's teacher scores its rows' sampled tokens, and
each token's distillation term (rlgen.algo.distill: distill_coef times log pi_teacher - log pi_engine, the negative
reverse KL's estimate) is made here, once, in every data rank's token batch layout. The phase goes on the timeline
as the ranks' `teacher` spans."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlgen.runtime.run_handle import Run
from rlgen.types import StepTimeline

if TYPE_CHECKING:
    import torch

    from rlgen.learners.token_batch import TokenBatch


@dataclass(frozen=True)
class TeacherTerms:
    """Each data rank's per-token term [N_d, L_d] and the step's distillation metrics."""

    terms: list[torch.Tensor]
    metrics: dict[str, float]


def teacher_terms(run: Run, step: int, packed: list[TokenBatch], tl: StepTimeline) -> TeacherTerms:
    """The teacher's scores of every rank's rows, made into each token's distillation term."""
    from rlgen.algo.distill import distill_term, reverse_kl

    group = run.learner_group
    per_rank = group.wait(group.ask("teacher_logprobs", packed), f"the teacher's scores of step {step}")
    for rank, scores in enumerate(per_rank):
        tl.add_spans(f"learner{rank}", scores.spans)
    coef = run.cfg.algo.distill_coef
    terms, gap, tokens = [], 0.0, 0
    for shard, scores in zip(packed, group.leads(per_rank)):
        terms.append(distill_term(scores.logp, shard.engine_logp, shard.mask, coef))  # [N_d, L_d]
        shard_gap, shard_tokens = reverse_kl(scores.logp, shard.engine_logp, shard.mask)
        gap, tokens = gap + shard_gap, tokens + shard_tokens
    return TeacherTerms(terms, {"distill/reverse_kl": gap / max(tokens, 1)})


__all__ = ["TeacherTerms", "teacher_terms"]
