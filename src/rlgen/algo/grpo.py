"""GRPO maths: group advantages, token logprobs, loss aggregation, the clipped policy loss and k3 KL.

Pure torch functions. N = sequences, L = response length, T = positions, V = vocabulary.
Masks are float or bool tensors with 1 on tokens that count; values under a 0 are never read (they may be
non-finite without leaking into results).
"""

from __future__ import annotations

import math

import torch

from rlgen.algo.registry import Algorithm
from rlgen.config import AlgoConfig, LossAgg


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, std_normalize: bool, eps: float = 1e-6
) -> torch.Tensor:
    """A_i = r_i - mean(group), divided by (std(group) + eps) when std_normalize.

    The std is the population std (unbiased=False: divide by the group size, not size - 1), so a group of
    one has std 0. A group whose rewards are all equal (a group of one included) gets exactly 0.
    rewards: [N], group_ids: [N] (any integers) -> [N] float32.
    """
    rewards = rewards.to(torch.float32)  # [N]
    _, inv = torch.unique(group_ids, return_inverse=True)  # inv: [N] in [0, G)
    num_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    zeros = torch.zeros(num_groups, device=rewards.device)  # [G]
    count = zeros.index_add(0, inv, torch.ones_like(rewards))  # [G]
    mean = zeros.index_add(0, inv, rewards) / count  # [G]
    centred = rewards - mean[inv]  # [N]
    var = zeros.index_add(0, inv, centred * centred) / count  # [G]
    lo = torch.full_like(zeros, math.inf).scatter_reduce(0, inv, rewards, "amin")  # [G]
    hi = torch.full_like(zeros, -math.inf).scatter_reduce(0, inv, rewards, "amax")  # [G]
    adv = centred / (var.sqrt()[inv] + eps) if std_normalize else centred  # [N]
    constant = (lo == hi)[inv]  # [N]
    return torch.where(constant, torch.zeros_like(adv), adv)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] in float32. logits: [N, T, V], targets: [N, T] -> [N, T].

    Computed as logit[target] - logsumexp(logits), never forming a full log-softmax. Float32 logits are
    used in place; lower-precision logits are upcast one row at a time, so at most one extra [N, T, V]
    float32 tensor exists (the upcast rows kept for backward).
    """
    if logits.dtype == torch.float32:
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, T]
        return picked - torch.logsumexp(logits, dim=-1)  # [N, T]
    rows = []
    for row_logits, row_targets in zip(logits, targets):  # [T, V], [T]
        row = row_logits.float()  # [T, V]
        picked = row.gather(-1, row_targets.unsqueeze(-1)).squeeze(-1)  # [T]
        rows.append(picked - torch.logsumexp(row, dim=-1))
    return torch.stack(rows)  # [N, T]


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values where mask is set, else 0 (a where, so non-finite values under the mask's zeros vanish)."""
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def normaliser(mask: torch.Tensor, agg: LossAgg, max_new_tokens: int) -> float:
    """The denominator `aggregate` divides by for this mask [N, L]; see `aggregate`."""
    agg = LossAgg(agg)
    m = mask.bool()  # [N, L]
    if agg is LossAgg.token_mean:
        return float(m.sum().item())
    if agg is LossAgg.seq_mean_token_mean:
        return float(m.any(dim=-1).sum().item())
    return float(m.shape[0])


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    agg: LossAgg,
    max_new_tokens: int,
    *,
    denominator: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values [N, L] under mask [N, L] to a scalar: numerator / denominator.

    token_mean:              sum_i,t v*m / sum_i,t m
    seq_mean_token_mean:     sum_i (sum_t v*m / sum_t m) / #(sequences with >= 1 token)
    seq_mean_token_sum_norm: sum_i (sum_t v*m / max_new_tokens) / N
    A zero denominator gives 0. `denominator` replaces the one computed from this mask (a learner that
    splits a batch into micro-batches passes 1 and divides the summed gradients by the whole batch's).
    """
    agg = LossAgg(agg)
    v = _masked(values, mask)  # [N, L]
    if agg is LossAgg.token_mean:
        num = v.sum()
    elif agg is LossAgg.seq_mean_token_mean:
        tokens = mask.bool().sum(dim=-1).clamp(min=1)  # [N]
        num = (v.sum(dim=-1) / tokens).sum()
    else:
        num = v.sum() / max_new_tokens
    den = normaliser(mask, agg, max_new_tokens) if denominator is None else denominator
    return num / den if den > 0 else num * 0.0


def sequence_keep(
    logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, seq_mask_cap: float
) -> torch.Tensor:
    """[N] bool: False for a sequence whose mean |logp - engine_logp| over its tokens exceeds
    log(seq_mask_cap). All True when seq_mask_cap <= 0. A non-finite mean is kept (it must reach the loss
    and trip the learner's non-finite guard rather than be silently dropped)."""
    keep = torch.ones(logp.shape[0], dtype=torch.bool, device=logp.device)  # [N]
    if seq_mask_cap <= 0:
        return keep
    delta = _masked((logp.detach() - engine_logp).abs(), mask)  # [N, L]
    mean = delta.sum(dim=-1) / mask.bool().sum(dim=-1).clamp(min=1)  # [N]
    return ~(mean > math.log(seq_mask_cap))


def policy_loss(
    logp: torch.Tensor,
    engine_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    tis_cap: float,
    seq_mask_cap: float,
    agg: LossAgg,
    max_new_tokens: int,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped GRPO surrogate against the engine's (behaviour) logprobs.

    logp, engine_logp, mask: [N, L]; advantages: [N]. sg = stop-gradient.
      ratio          rho = exp(logp - engine_logp)   (the engine's logprobs are the old/behaviour logprobs)
      PPO surrogate  s = min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)
      truncated IS   if tis_cap C > 0: where rho > C, s <- s * C / sg(rho); on the unclipped branch the
                     value is C * A and the gradient C * A * grad(logp): the IS weight is truncated at C
                     but the token still contributes (tis_cap = 0 disables)
      sequence mask  if seq_mask_cap > 0: a sequence whose mean over its tokens of sg|logp - engine_logp|
                     exceeds log(seq_mask_cap) gets mask 0 (mask' = mask * keep)
      loss           -aggregate(s, mask', agg, max_new_tokens)
    Metrics (floats): clip_frac and tis_frac are fractions of the tokens under mask' whose clipped branch
    is active (A > 0 and rho > 1 + clip_high, or A < 0 and rho < 1 - clip_low), resp. whose rho > C;
    seq_masked_frac is the fraction of sequences with >= 1 token that were masked; ratio_mean and ratio_max
    are over all tokens under mask. `denominator` is passed to `aggregate`.
    """
    m = mask.bool()  # [N, L]
    log_ratio = _masked(logp - engine_logp, m)  # [N, L]; 0 off the mask, so rho = 1 there
    ratio = torch.exp(log_ratio)  # [N, L]
    adv = advantages.to(logp.dtype).unsqueeze(-1)  # [N, 1]
    unclipped = ratio * adv  # [N, L]
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv  # [N, L]
    surrogate = torch.minimum(unclipped, clipped)  # [N, L]
    clip_active = ((adv > 0) & (ratio > 1.0 + clip_high)) | ((adv < 0) & (ratio < 1.0 - clip_low))  # [N, L]
    truncated = torch.zeros_like(m)  # [N, L]
    if tis_cap > 0:
        truncated = ratio.detach() > tis_cap
        scale = torch.where(truncated, tis_cap / ratio.detach(), torch.ones_like(ratio))  # [N, L]
        surrogate = surrogate * scale
    keep = sequence_keep(logp, engine_logp, m, seq_mask_cap)  # [N]
    loss_mask = m & keep.unsqueeze(-1)  # [N, L]
    loss = -aggregate(surrogate, loss_mask, agg, max_new_tokens, denominator=denominator)

    loss_tokens = max(int(loss_mask.sum().item()), 1)
    tokens = int(m.sum().item())
    seqs = m.any(dim=-1)  # [N]
    r = ratio.detach()[m]  # [tokens]
    metrics = {
        "clip_frac": float((clip_active & loss_mask).sum().item()) / loss_tokens,
        "tis_frac": float((truncated & loss_mask).sum().item()) / loss_tokens,
        "seq_masked_frac": float((seqs & ~keep).sum().item()) / max(int(seqs.sum().item()), 1),
        "ratio_mean": float(r.mean().item()) if tokens else 1.0,
        "ratio_max": float(r.max().item()) if tokens else 1.0,
    }
    return loss, metrics


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(policy || ref) per token on the policy's samples: exp(d) - d - 1, d = ref - logp.

    logp, ref_logp: [N, L] -> [N, L], >= 0 and 0 where they agree.
    """
    d = ref_logp - logp  # [N, L]
    return torch.exp(d) - d - 1.0


# -- GRPO as an algorithm: group-normalised advantages, the clipped surrogate with truncated IS ---------------
def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """rewards [N], group_ids [N] -> [N]: centred on the group mean, divided by its std when algo.std_normalize."""
    return group_advantages(rewards, group_ids, algo.std_normalize)


def grpo_loss(logp: torch.Tensor, engine_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              algo: AlgoConfig, denominator: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """policy_loss with the algo config's clip range, IS cap, sequence mask and aggregation."""
    return policy_loss(logp, engine_logp, advantages, mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
                       tis_cap=algo.tis_cap, seq_mask_cap=algo.seq_mask_cap, agg=algo.loss_agg,
                       max_new_tokens=algo.max_new_tokens, denominator=denominator)


ALGORITHM = Algorithm("grpo", advantages=grpo_advantages, loss=grpo_loss)
