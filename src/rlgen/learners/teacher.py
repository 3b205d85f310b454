"""On-policy distillation's teacher on a learner rank: a frozen model loaded beside the policy (the learners'
reference slot, rlgen.plan.teacher) that scores the rank's own rows before the update, each sampled response token's
logprob at the sampling temperature, teacher-forced. The driver turns these into each token's advantage
(rlgen.runtime.step.teacher)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from rlgen.config import AlgoConfig
from rlgen.learners.grpo_step import reference_logprobs
from rlgen.learners.token_batch import TokenBatch
from rlgen.types import Phase


@dataclass(frozen=True)
class TeacherScores:
    """A rank's rows scored by the teacher: [N, L] in its token batch's layout, and its span."""

    logp: torch.Tensor  # [N, L] float32 on the CPU: the teacher's logprob of each response token, 0 off the mask
    spans: tuple[tuple[str, float, float], ...]  # (phase, start, end): the teacher phase, as every actor reports


def teacher_logprobs(teacher: nn.Module, step: TokenBatch, algo: AlgoConfig) -> TeacherScores:
    """The teacher's logprobs of every response token of the batch, one no-grad forward per micro-batch."""
    start = time.time()
    out = torch.zeros(step.n_rows, step.resp_len, device=step.device)  # [N, L]
    for micro in step.micros():
        logp = reference_logprobs(teacher, micro.packed, algo)  # [n, Lm]
        out[micro.rows, : logp.shape[1]] = torch.where(micro.mask, logp.float(), torch.zeros_like(logp, dtype=out.dtype))
    return TeacherScores(out.cpu(), ((Phase.teacher.value, start, time.time()),))


__all__ = ["TeacherScores", "teacher_logprobs"]
