"""On-policy distillation's maths (docs/algorithms.md, section 11). The student samples y ~ pi_student; a frozen
teacher scores each sampled token. With d_t = log pi_teacher(y_t) - log pi_student(y_t) on the student's own sample,
-d_t is the single-sample (k1) estimate of the per-token reverse KL, KL(pi_student || pi_teacher), and each token's
advantage is

    A_t = (1 - c) A_task + c d_t        (c = algo.distill_coef; d_t = 0 off the response mask)

with no discounting: each token is credited with its own term only. The student's logprob is the engine's, the
policy that sampled the token. That is algo.distill_estimator=sampled.

With algo.distill_estimator=full the teacher's whole next-token distribution at each position the student's
sample visits is the signal: the loss adds c times the exact per-token reverse KL over the vocabulary,

    KL_t = sum_v pi_student(v | y_<t) (log pi_student(v | y_<t) - log pi_teacher(v | y_<t))

aggregated as the policy loss is, and the advantage keeps only (1 - c) A_task (rlgen.learners.packed computes KL_t
a chunk of tokens at a time, with the student's gradient). Pure torch: N = sequences, L = response length."""

from __future__ import annotations

import torch

from rlgen.metrics.reduce import TOKEN_MEAN, Reduced


def distill_term(teacher_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                 coef: float) -> torch.Tensor:
    """c d_t = c (log pi_teacher - log pi_engine) per response token, 0 off the mask: [N, L] each -> [N, L]."""
    mask = mask.bool()
    return coef * torch.where(mask, teacher_logp - engine_logp, torch.zeros_like(engine_logp))


def reverse_kl(teacher_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, int]:
    """(sum of -d_t over the response tokens, their count): the k1 estimate of KL(pi_student || pi_teacher),
    summed, for a mean over several shards."""
    mask = mask.bool()
    return float(torch.where(mask, engine_logp - teacher_logp, torch.zeros_like(engine_logp)).sum()), int(mask.sum())


def full_reverse_kl(kl: torch.Tensor, mask: torch.Tensor) -> dict[str, Reduced]:
    """distill/reverse_kl of a micro-batch under the full estimator: the mean of KL_t [n, Lm] over its response
    tokens (mask), merged over micro-batches and ranks by their response tokens."""
    mask = mask.bool()
    tokens = int(mask.sum())
    return {"distill/reverse_kl": Reduced(float(kl.detach()[mask].sum()) / max(tokens, 1), TOKEN_MEAN)}


def task_share(advantages: torch.Tensor, coef: float) -> torch.Tensor:
    """(1 - c) A_task: the task's part of each token's advantage, [N] -> [N]."""
    return (1.0 - coef) * advantages


__all__ = ["distill_term", "full_reverse_kl", "reverse_kl", "task_share"]
