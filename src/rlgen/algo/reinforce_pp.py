"""REINFORCE++ (Hu et al. 2025, "REINFORCE++: Stabilizing Critic-Free Policy Optimization with Global Advantage
Normalization"): no per-prompt std; advantages are whitened over the whole batch. Its "baseline" variant first
subtracts the mean reward of the sample's prompt group."""

from __future__ import annotations

import torch

from rlgen.algo.advantages import group_advantages
from rlgen.config import AlgoConfig, ScaleRewards


def _whiten(values: torch.Tensor, use: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(v - mean) / (std + eps) over the entries of values [N] where use [N] is set (population std); 0 elsewhere."""
    w = use.to(torch.float32)  # [N]
    v = torch.where(use, values, torch.zeros_like(values))  # [N]
    n = w.sum().clamp(min=1)
    centred = (v - v.sum() / n) * w  # [N]
    std = ((centred * centred).sum() / n).sqrt()
    return centred / (std + eps)


def reinforce_pp_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """A_i = (r_i - mean_batch r) / std_batch r (the batch-normalised baseline; a KL penalty, if any, is already
    in r with algo.kl_penalty=reward). A non-finite reward takes no part and gets 0. group_ids are not used.
    rewards: [N] -> [N] float32."""
    rewards = rewards.to(torch.float32)  # [N]
    return _whiten(rewards, torch.isfinite(rewards))


def reinforce_pp_baseline_advantages(rewards: torch.Tensor, group_ids: torch.Tensor,
                                     algo: AlgoConfig) -> torch.Tensor:
    """REINFORCE++-baseline: a_i = r_i - mean of i's group, then A = (a - mean_batch a) / std_batch a. A
    non-finite reward takes no part and gets 0. rewards, group_ids: [N] -> [N] float32."""
    rewards = rewards.to(torch.float32)  # [N]
    centred = group_advantages(rewards, group_ids, ScaleRewards.none)  # [N]; 0 for non-finite and constant groups
    return _whiten(centred, torch.isfinite(rewards))


__all__ = ["reinforce_pp_advantages", "reinforce_pp_baseline_advantages"]
