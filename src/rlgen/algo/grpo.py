"""GRPO as an algorithm: group-centred (and scaled) advantages on the driver; on the learner, the clipped
surrogate against the engine's logprobs with the importance-sampling correction, aggregated as algo.loss_agg.

Every option of the loss is a setting of AlgoConfig (docs/algorithms.md); the other presets (dr_grpo, dapo, gspo)
reuse these two functions with their own settings.
"""

from __future__ import annotations

import torch

from rlgen.algo.advantages import group_advantages
from rlgen.algo.loss import policy_loss
from rlgen.algo.registry import Algorithm
from rlgen.config import AlgoConfig


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """rewards [N], group_ids [N] -> [N]: centred on the group mean, scaled as algo.scale_rewards and
    algo.reward_std say; a non-finite reward gets 0."""
    return group_advantages(rewards, group_ids, algo.scale_rewards, algo.reward_std)


def grpo_loss(logp: torch.Tensor, engine_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              algo: AlgoConfig, denominator: float | None = None,
              token_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """policy_loss with the algo config's ratio level, clip range, IS correction, sequence mask and aggregation."""
    return policy_loss(logp, engine_logp, advantages, mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
                       tis_cap=algo.tis_cap, seq_mask_cap=algo.seq_mask_cap, agg=algo.loss_agg,
                       max_new_tokens=algo.max_new_tokens, denominator=denominator,
                       importance_level=algo.importance_level, tis_level=algo.tis_level, tis_mode=algo.tis_mode,
                       token_weight=token_weight)


ALGORITHM = Algorithm("grpo", advantages=grpo_advantages, loss=grpo_loss)
