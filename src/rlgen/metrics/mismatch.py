"""Trainer/engine logprob mismatch on the same sampled tokens. Pure torch; returns plain floats."""

from __future__ import annotations

import torch


def mismatch_metrics(
    trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, threshold: float
) -> dict[str, float]:
    """Compare trainer_logp [N, L] with engine_logp [N, L] on the tokens under mask [N, L].

    With r = trainer_logp - engine_logp on each masked token (the tokens were sampled by the engine):
      k3_kl               mean of exp(r) - r - 1, the k3 estimate of KL(engine || trainer)
      mean_abs_delta      mean |r|
      max_abs_delta       max |r|
      frac_over_threshold fraction of tokens with |r| > threshold (a non-finite r counts as over)
      tokens              number of masked tokens
    No masked tokens: every value is 0. A non-finite r is never hidden: max_abs_delta (and the means)
    become inf or nan. Computed in float64.
    """
    m = mask.bool()  # [N, L]
    r = (trainer_logp.detach().double() - engine_logp.detach().double())[m]  # [tokens]
    tokens = int(r.numel())
    if tokens == 0:
        return {
            "k3_kl": 0.0,
            "mean_abs_delta": 0.0,
            "max_abs_delta": 0.0,
            "frac_over_threshold": 0.0,
            "tokens": 0,
        }
    abs_r = r.abs()  # [tokens]
    return {
        "k3_kl": float((torch.exp(r) - r - 1.0).mean().item()),
        "mean_abs_delta": float(abs_r.mean().item()),
        "max_abs_delta": float(abs_r.max().item()),
        "frac_over_threshold": float((~(abs_r <= threshold)).double().mean().item()),
        "tokens": tokens,
    }
