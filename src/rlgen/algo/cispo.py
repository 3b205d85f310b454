"""CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"): clip the
importance-sampling weight, not the update. Every token keeps a gradient, weighed by its clipped ratio."""

from __future__ import annotations

import torch

from rlgen.algo.inputs import LossInputs, LossOutputs
from rlgen.algo.loss import aggregate, check_advantages, is_weight, log_ratio, ratio_metrics, sequence_keep
from rlgen.config import AlgoConfig, Level, OldLogprobs


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
    trainer = inputs.trainer_before()  # [n, L]
    tis, over_cap = is_weight(trainer, inputs.engine_logp, m, algo.tis_cap, algo.tis_level, algo.tis_mode,
                              in_ratio=OldLogprobs(algo.old_logprobs) is OldLogprobs.engine)  # [n, L]
    values = weight * tis * adv * logp  # [n, L]
    if inputs.token_weight is not None:
        values = values * inputs.token_weight
    keep = sequence_keep(trainer, inputs.engine_logp, m, algo.seq_mask_cap)  # [n]
    loss_mask = m & keep.unsqueeze(-1)  # [n, L]
    loss = -aggregate(values, loss_mask, algo.loss_agg, algo.max_new_tokens, denominator=inputs.denominator)
    return LossOutputs(loss, ratio_metrics(ratio, (ratio > high) | (ratio < low), over_cap, m, keep))


__all__ = ["cispo_loss"]
