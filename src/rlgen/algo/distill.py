"""On-policy distillation's maths (docs/algorithms.md, section 11). The student samples y ~ pi_student; a frozen
teacher scores each sampled token. With d_t = log pi_teacher(y_t) - log pi_student(y_t) on the student's own sample,
-d_t is the single-sample (k1) estimate of the per-token reverse KL, KL(pi_student || pi_teacher), and each token's
advantage is

    A_t = (1 - c) A_task + c d_t        (c = algo.distill_coef; d_t = 0 off the response mask)

with no discounting: each token is credited with its own term only. The student's logprob is the engine's, the
policy that sampled the token. Pure torch: N = sequences, L = response length."""

from __future__ import annotations

import torch


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


def task_share(advantages: torch.Tensor, coef: float) -> torch.Tensor:
    """(1 - c) A_task: the task's part of each token's advantage, [N] -> [N]."""
    return (1.0 - coef) * advantages


__all__ = ["distill_term", "reverse_kl", "task_share"]
