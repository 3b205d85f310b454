"""CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"): clip the
importance-sampling weight, not the update. Every token keeps a gradient, weighed by its clipped ratio."""

from __future__ import annotations

import torch

from rlgen.algo.inputs import LossInputs, LossOutputs
from rlgen.algo.loss import broadcast_advantages, cap_in_ratio, corrected_loss, is_correction, log_ratio
from rlgen.config import AlgoConfig, Level


def cispo_loss(inputs: LossInputs, algo: AlgoConfig) -> LossOutputs:
    """Per token, r_t = exp(logp_t - old_t), lo = max(0, 1 - clip_low), hi = 1 + clip_high, and
      v_t = sg(clip(r_t, lo, hi)) * A * logp_t
    with the engine/trainer correction (w = sg(trainer_before / engine), algo.tis_*) applied once:
      old_logprobs=engine, tis_mode=truncate   r_t carries w, so the cap acts inside the clip:
                                               v_t = sg(clip(r_t * min(1, tis_cap / w_t), lo, hi)) * A * logp_t
                                               (at the update r = w: weight w, then hi, then min(hi, tis_cap))
      otherwise                                v_t <- v_t * is_weight (trainer: min(w, tis_cap); mask: 0 over the cap)
    then the token weight and sequence masking as in ppo_clip; loss = -aggregate(v) (the paper's token-level
    mean: algo.loss_agg=token_mean). The paper sets no lower bound (clip_low >= 1) and tunes clip_high. clip_frac
    counts the tokens whose weight was clipped. Raises AdvantageShapeError when the advantages are not [n] or
    [n, L]."""
    logp, m = inputs.logp, inputs.mask.bool()  # [n, L]
    ratio = torch.exp(log_ratio(logp.detach(), inputs.old_logp, m, Level.token))  # [n, L], no gradient
    correction, over = is_correction(inputs, algo)  # [n, L]
    inside = cap_in_ratio(algo)
    capped = ratio * correction if inside else ratio  # [n, L]: a w above the cap counts as the cap
    low, high = max(0.0, 1.0 - algo.clip_low), 1.0 + algo.clip_high
    weight = torch.clamp(capped, low, high)  # [n, L]
    adv = broadcast_advantages(inputs.advantages, logp)  # [n, 1], or [n, L] per token (distillation)
    values = weight * adv * logp  # [n, L]
    rest = (torch.ones_like(correction), over) if inside else (correction, over)
    return corrected_loss(values, ratio, (capped > high) | (capped < low), inputs, algo, rest)


__all__ = ["cispo_loss"]
