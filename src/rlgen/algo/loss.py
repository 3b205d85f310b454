"""The policy-gradient maths the algorithms share: token logprobs, loss aggregation, the clipped surrogate (per
token or per sequence) with the engine/trainer importance-sampling correction, the KL estimators and the token
entropy. Pure torch functions; docs/algorithms.md gives each formula and its source.

N = sequences, L = response length, T = positions, V = vocabulary. Masks are float or bool tensors with 1 on
tokens that count; values under a 0 are never read (they may be non-finite without leaking into results).
"""

from __future__ import annotations

import math

import torch

from rlgen.config import ISMode, KLEstimator, Level, LossAgg


class AdvantageShapeError(ValueError):
    """The advantages are not one value per sequence of the logprobs."""


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


def _log_ratio(logp: torch.Tensor, engine_logp: torch.Tensor, m: torch.Tensor, level: Level) -> torch.Tensor:
    """log(pi / pi_engine) per token [N, L] (0 off the mask), or per sequence, the mean over its tokens, broadcast
    to its tokens (a sequence without tokens: 0)."""
    log_ratio = _masked(logp - engine_logp, m)  # [N, L]
    if level is Level.token:
        return log_ratio
    seq = log_ratio.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)  # [N]
    return seq.unsqueeze(-1).expand_as(log_ratio)


def is_weight(
    logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, cap: float, level: Level | str, mode: ISMode | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine/trainer importance-sampling correction (no gradient): (weight [N, L] that multiplies each
    token's surrogate, over [N, L] bool: tokens whose IS weight w exceeded the cap).

    w = sg(pi / pi_engine) per token, or per sequence the geometric mean over its tokens, sg(exp(mean_t log rho)).
    truncate: weight = min(1, cap / w), so a weight above the cap counts as the cap; mask: weight = 0 where
    w > cap (the token, or the whole sequence, leaves the loss's numerator; denominators are unchanged).
    cap <= 0: all ones.
    """
    m = mask.bool()
    ones = torch.ones_like(logp)
    if cap <= 0:
        return ones, torch.zeros_like(m)
    w = torch.exp(_log_ratio(logp.detach(), engine_logp, m, Level(level)))  # [N, L]
    over = (w > cap) & m  # [N, L]
    if ISMode(mode) is ISMode.truncate:
        return torch.where(over, cap / w, ones), over
    return torch.where(over, torch.zeros_like(w), ones), over


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
    importance_level: Level | str = Level.token,
    tis_level: Level | str = Level.token,
    tis_mode: ISMode | str = ISMode.truncate,
    token_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate against the engine's (behaviour) logprobs.

    logp, engine_logp, mask: [N, L]; advantages: [N]. sg = stop-gradient.
      ratio          token (GRPO): rho_t = exp(logp_t - engine_t); sequence (GSPO): s = exp(mean_t (logp_t -
                     engine_t)), the same for every token of the sequence
      PPO surrogate  v = min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)
      IS correction  v <- v * is_weight(...) (tis_cap, tis_level, tis_mode): truncate keeps a token whose weight
                     is over the cap at the cap (value cap * A, gradient cap * A * grad logp on the unclipped
                     branch); mask drops it
      sequence mask  if seq_mask_cap > 0: a sequence whose mean over its tokens of sg|logp - engine_logp|
                     exceeds log(seq_mask_cap) gets mask 0 (mask' = mask * keep)
      token weight   v <- v * token_weight (the entropy mask; None: 1)
      loss           -aggregate(v, mask', agg, max_new_tokens)
    Metrics (floats): clip_frac and tis_frac are fractions of the tokens under mask' whose clipped branch is
    active (A > 0 and rho > 1 + clip_high, or A < 0 and rho < 1 - clip_low), resp. whose IS weight exceeded the
    cap; seq_masked_frac is the fraction of sequences with >= 1 token that were masked; ratio_mean and ratio_max
    are of rho over all tokens under mask. `denominator` is passed to `aggregate`.
    Raises AdvantageShapeError when advantages is not [N].
    """
    if advantages.shape != (logp.shape[0],):
        raise AdvantageShapeError(
            f"the advantages have shape {list(advantages.shape)}, but the batch has {logp.shape[0]} sequences: an "
            f"algorithm's advantages must give one value per sequence, shape [{logp.shape[0]}].")
    m = mask.bool()  # [N, L]
    ratio = torch.exp(_log_ratio(logp, engine_logp, m, Level(importance_level)))  # [N, L]; 1 off the mask
    adv = advantages.to(logp.dtype).unsqueeze(-1)  # [N, 1]
    unclipped = ratio * adv  # [N, L]
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv  # [N, L]
    surrogate = torch.minimum(unclipped, clipped)  # [N, L]
    clip_active = ((adv > 0) & (ratio > 1.0 + clip_high)) | ((adv < 0) & (ratio < 1.0 - clip_low))  # [N, L]
    weight, over_cap = is_weight(logp, engine_logp, m, tis_cap, tis_level, tis_mode)  # [N, L]
    surrogate = surrogate * weight
    if token_weight is not None:
        surrogate = surrogate * token_weight
    keep = sequence_keep(logp, engine_logp, m, seq_mask_cap)  # [N]
    loss_mask = m & keep.unsqueeze(-1)  # [N, L]
    loss = -aggregate(surrogate, loss_mask, agg, max_new_tokens, denominator=denominator)

    loss_tokens = max(int(loss_mask.sum().item()), 1)
    tokens = int(m.sum().item())
    seqs = m.any(dim=-1)  # [N]
    r = ratio.detach()[m]  # [tokens]
    metrics = {
        "clip_frac": float((clip_active & loss_mask).sum().item()) / loss_tokens,
        "tis_frac": float((over_cap & loss_mask).sum().item()) / loss_tokens,
        "seq_masked_frac": float((seqs & ~keep).sum().item()) / max(int(seqs.sum().item()), 1),
        "ratio_mean": float(r.mean().item()) if tokens else 1.0,
        "ratio_max": float(r.max().item()) if tokens else 1.0,
    }
    return loss, metrics


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator | str = KLEstimator.k3) -> torch.Tensor:
    """Per-token estimate of KL(policy || ref) on the policy's samples, d = logp - ref_logp ([N, L] -> [N, L]):
    k1 = d (unbiased, may be negative), k2 = d^2 / 2, k3 = exp(-d) + d - 1 (unbiased and >= 0). All are 0 where
    the two agree."""
    d = logp - ref_logp  # [N, L]
    est = KLEstimator(estimator)
    if est is KLEstimator.k1:
        return d
    if est is KLEstimator.k2:
        return 0.5 * d * d
    return torch.exp(-d) + d - 1.0


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(policy || ref) per token: exp(d) - d - 1, d = ref - logp. [N, L] -> [N, L], >= 0."""
    return kl_estimate(logp, ref_logp, KLEstimator.k3)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's distribution: logits [N, L, V] -> [N, L] (with the logits' gradient)."""
    logz = torch.logsumexp(logits, dim=-1)  # [N, L]
    probs = torch.softmax(logits, dim=-1)  # [N, L, V]
    return logz - (probs * logits).sum(dim=-1)


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, frac: float) -> torch.Tensor:
    """[N, L] float: 1 on the tokens under mask whose entropy is among the highest `frac` of them (ties at the
    threshold kept), else 0. frac >= 1: the mask itself."""
    m = mask.bool()
    if frac >= 1.0:
        return m.to(entropy.dtype)
    values = entropy.detach()[m]  # [tokens]
    if values.numel() == 0:
        return m.to(entropy.dtype)
    threshold = torch.quantile(values.float(), 1.0 - frac)
    return (m & (entropy.detach() >= threshold)).to(entropy.dtype)


__all__ = ["AdvantageShapeError", "aggregate", "is_weight", "kl_estimate", "kl_k3", "normaliser", "policy_loss",
           "sequence_keep", "token_entropy", "token_logprobs", "top_entropy_mask"]
