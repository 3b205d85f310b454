"""The PPO clipped surrogate (GRPO, Dr. GRPO, DAPO, GSPO, REINFORCE++ and RLOO presets): the ratio per token or per
sequence against pi_old, clipped to [1 - clip_low, 1 + clip_high], with the engine/trainer IS correction."""

from __future__ import annotations

import torch

from rlgen.algo.inputs import LossInputs, LossOutputs
from rlgen.algo.loss import broadcast_advantages, corrected_loss, log_ratio
from rlgen.config import AlgoConfig


def ppo_clip_loss(inputs: LossInputs, algo: AlgoConfig) -> LossOutputs:
    """sg = stop-gradient; A = advantages [n] broadcast over each sequence's tokens, or [n, L] one per token.
      ratio          token: rho_t = exp(logp_t - old_t); sequence (GSPO): s = exp(mean_t (logp_t - old_t)) for every
                     token of the sequence (algo.importance_level)
      surrogate      v = min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)
      IS correction  v <- v * is_weight(trainer_before, engine_logp, ...) (algo.tis_cap, tis_level, tis_mode)
      sequence mask  algo.seq_mask_cap > 0: a sequence whose mean sg|trainer - engine| exceeds log(seq_mask_cap)
                     leaves the loss (mask' = mask * keep)
      token weight   v <- v * token_weight (the entropy mask)
      loss           -aggregate(v, mask', algo.loss_agg, algo.max_new_tokens, inputs.denominator)
    Raises AdvantageShapeError when the advantages are not [n] or [n, L].
    """
    logp, m = inputs.logp, inputs.mask.bool()  # [n, L]
    ratio = torch.exp(log_ratio(logp, inputs.old_logp, m, algo.importance_level))  # [n, L]; 1 off the mask
    adv = broadcast_advantages(inputs.advantages, logp)  # [n, 1], or [n, L] per token (distillation)
    clipped = torch.clamp(ratio, 1.0 - algo.clip_low, 1.0 + algo.clip_high) * adv  # [n, L]
    surrogate = torch.minimum(ratio * adv, clipped)  # [n, L]
    clip_active = ((adv > 0) & (ratio > 1.0 + algo.clip_high)) | ((adv < 0) & (ratio < 1.0 - algo.clip_low))
    return corrected_loss(surrogate, ratio, clip_active, inputs, algo)


__all__ = ["ppo_clip_loss"]
