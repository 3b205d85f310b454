"""From rewards to advantages: group centring and scaling, the overlong length penalty, and which groups carry no
signal. Pure torch functions; N = sequences."""

from __future__ import annotations

import math

import torch

from rlgen.config import AlgoConfig, RewardStd, ScaleRewards


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """GRPO's estimator (algo.advantage=grpo): rewards [N], group_ids [N] -> [N], centred on the group mean and
    scaled as algo.scale_rewards and algo.reward_std say; a non-finite reward gets 0."""
    return group_advantages(rewards, group_ids, algo.scale_rewards, algo.reward_std)


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    scale: ScaleRewards | str = ScaleRewards.group,
    std: RewardStd | str = RewardStd.population,
    eps: float = 1e-6,
) -> torch.Tensor:
    """A_i = r_i - mean(r of i's group), divided by a std chosen by `scale`:
      group  std of i's group (GRPO)     batch  std of every reward of the batch     none  not divided (Dr. GRPO)

    `std` is the population std (divide by n) or the unbiased one (n - 1; a single value has std 0). A reward that
    is not finite (a reward function returned NaN) takes no part in any mean or std and gets advantage 0; so does
    every member of a group whose finite rewards are all equal (a group of one included).
    rewards: [N], group_ids: [N] (any integers) -> [N] float32.
    """
    scale, std = ScaleRewards(scale), RewardStd(std)
    rewards = rewards.to(torch.float32)  # [N]
    finite = torch.isfinite(rewards)  # [N]
    r = torch.where(finite, rewards, torch.zeros_like(rewards))  # [N]
    w = finite.to(torch.float32)  # [N]
    _, inv = torch.unique(group_ids, return_inverse=True)  # inv: [N] in [0, G)
    num_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    zeros = torch.zeros(num_groups, device=rewards.device)  # [G]
    count = zeros.index_add(0, inv, w)  # [G] finite rewards per group
    mean = zeros.index_add(0, inv, r) / count.clamp(min=1)  # [G]
    centred = (r - mean[inv]) * w  # [N]
    constant = ~informative_groups(rewards, group_ids)  # [N]: no two different finite rewards in the group
    if scale is ScaleRewards.group:
        ss = zeros.index_add(0, inv, centred * centred)  # [G]
        adv = centred / (_std(ss, count, std)[inv] + eps)
    elif scale is ScaleRewards.batch:
        n = w.sum()
        batch_centred = (r - (r.sum() / n.clamp(min=1))) * w  # [N]
        adv = centred / (_std((batch_centred * batch_centred).sum(), n, std) + eps)
    else:
        adv = centred
    return torch.where(constant | ~finite, torch.zeros_like(adv), adv)


def _std(sum_sq: torch.Tensor, n: torch.Tensor, std: RewardStd) -> torch.Tensor:
    """sqrt(sum_sq / n) (population) or sqrt(sum_sq / (n - 1)) (unbiased); 0 where there are too few values."""
    den = n - 1 if std is RewardStd.unbiased else n
    return torch.where(den > 0, sum_sq / den.clamp(min=1), torch.zeros_like(sum_sq)).sqrt()


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment, scaled by `penalty`: 0 for a response of at most max_new_tokens - buffer
    tokens, then falling linearly to -penalty at max_new_tokens (and -penalty beyond). lengths: [N] -> [N];
    buffer 0: all zeros."""
    lengths = lengths.to(torch.float32)  # [N]
    if buffer <= 0:
        return torch.zeros_like(lengths)
    over = (lengths - (max_new_tokens - buffer)).clamp(min=0) / buffer  # [N], 0 .. >= 1
    return -penalty * over.clamp(max=1.0)


def informative_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """[N] bool: whether each sequence's group has two different finite rewards (a group whose rewards are all
    equal has advantages of 0 and teaches nothing; dynamic sampling drops it)."""
    rewards = rewards.to(torch.float32)
    finite = torch.isfinite(rewards)
    _, inv = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    lo = torch.full((num_groups,), math.inf).scatter_reduce(0, inv, torch.where(finite, rewards, math.inf), "amin")
    hi = torch.full((num_groups,), -math.inf).scatter_reduce(0, inv, torch.where(finite, rewards, -math.inf), "amax")
    return (lo < hi)[inv]


__all__ = ["grpo_advantages", "group_advantages", "informative_groups", "overlong_penalty"]
