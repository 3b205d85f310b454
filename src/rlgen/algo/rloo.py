"""RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
Feedback in LLMs"): each sample's baseline is the mean reward of the other samples of its prompt."""

from __future__ import annotations

import torch

from rlgen.algo.advantages import informative_groups
from rlgen.config import AlgoConfig


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """A_i = r_i - (sum_{j in g(i), j != i} r_j) / (k - 1), k = finite rewards of i's group g(i); equal to
    k / (k - 1) * (r_i - mean_g r). Not divided by a std. A non-finite reward, a group with fewer than two finite
    rewards, and a group whose rewards are all equal get 0. rewards, group_ids: [N] -> [N] float32."""
    rewards = rewards.to(torch.float32)  # [N]
    finite = torch.isfinite(rewards)  # [N]
    r = torch.where(finite, rewards, torch.zeros_like(rewards))  # [N]
    _, inv = torch.unique(group_ids, return_inverse=True)  # [N] in [0, G)
    num_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    zeros = torch.zeros(num_groups, device=rewards.device)  # [G]
    count = zeros.index_add(0, inv, finite.to(torch.float32))[inv]  # [N] finite rewards in i's group
    total = zeros.index_add(0, inv, r)[inv]  # [N]
    others = (total - r) / (count - 1).clamp(min=1)  # [N] the leave-one-out mean
    adv = r - others
    use = finite & (count >= 2) & informative_groups(rewards, group_ids)
    return torch.where(use, adv, torch.zeros_like(adv))


__all__ = ["rloo_advantages"]
