"""CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"): clip the
importance-sampling weight, not the update. Every token keeps a gradient, weighed by its clipped ratio."""

from __future__ import annotations

import torch

from rlgen.algo.inputs import LossInputs, LossOutputs
from rlgen.algo.loss import check_advantages, corrected_loss, log_ratio
from rlgen.config import AlgoConfig, Level


def cispo_loss(inputs: LossInputs, algo: AlgoConfig) -> LossOutputs:
    """Per token, r_t = exp(logp_t - old_t) and
      v_t = sg(clip(r_t, max(0, 1 - clip_low), 1 + clip_high)) * A * logp_t
    times the engine/trainer IS weight and the token weight, as in ppo_clip; loss = -aggregate(v) (the paper's
    token-level mean: algo.loss_agg=token_mean). The paper sets no lower bound (clip_low >= 1) and tunes
    clip_high. clip_frac counts the tokens whose weight was clipped. Raises AdvantageShapeError when the
    advantages are not [n]."""
    logp, m = inputs.logp, inputs.mask.bool()  # [n, L]
    check_advantages(inputs.advantages, logp)
    ratio = torch.exp(log_ratio(logp.detach(), inputs.old_logp, m, Level.token))  # [n, L], no gradient
    low, high = max(0.0, 1.0 - algo.clip_low), 1.0 + algo.clip_high
    weight = torch.clamp(ratio, low, high)  # [n, L]
    adv = inputs.advantages.to(logp.dtype).unsqueeze(-1)  # [n, 1]
    values = weight * adv * logp  # [n, L]
    return corrected_loss(values, ratio, (ratio > high) | (ratio < low), inputs, algo)


__all__ = ["cispo_loss"]
