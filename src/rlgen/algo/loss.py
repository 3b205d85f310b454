"""The policy-gradient maths the losses share: token logprobs, loss aggregation, ratios, the engine/trainer
importance-sampling correction, sequence masking, the loss metrics, the KL estimators and the token entropy.
Pure torch functions; docs/algorithms.md gives each formula and its source.

N = sequences, L = response length, T = positions, V = vocabulary. Masks are float or bool tensors with 1 on
tokens that count; values under a 0 are never read (they may be non-finite without leaking into results).
"""

from __future__ import annotations

import math

import torch

from rlgen.algo.inputs import LossInputs, LossOutputs
from rlgen.config import AlgoConfig, ISMode, KLEstimator, Level, LossAgg, OldLogprobs
from rlgen.metrics.reduce import LOSS_TOKEN_MEAN, MAX, SEQ_MEAN, Reduced


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


def log_ratio(logp: torch.Tensor, base_logp: torch.Tensor, m: torch.Tensor, level: Level | str) -> torch.Tensor:
    """log(pi / pi_base) per token [N, L] (0 off the mask), or per sequence, the mean over its tokens, broadcast
    to its tokens (a sequence without tokens: 0)."""
    per_token = _masked(logp - base_logp, m)  # [N, L]
    if Level(level) is Level.token:
        return per_token
    seq = per_token.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)  # [N]
    return seq.unsqueeze(-1).expand_as(per_token)


def is_weight(
    logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, cap: float, level: Level | str,
    mode: ISMode | str, *, in_ratio: bool = True, low: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine/trainer importance-sampling correction (no gradient): (weight [N, L] that multiplies each
    token's surrogate, out [N, L] bool: tokens whose IS weight w lies outside the band [low, cap]).

    logp: the trainer's logprobs before the update (LossInputs.trainer_before). w = sg(pi / pi_engine) per token,
    or per sequence the geometric mean over its tokens, sg(exp(mean_t log rho)).
    in_ratio (old_logprobs=engine: the ratio already carries w): truncate gives min(1, cap / w), so a w above
    the cap counts as the cap; mask gives 1.
    not in_ratio (old_logprobs=trainer: w is a factor of its own): truncate gives min(w, cap); mask gives w.
    Under mask, the tokens outside the band leave the loss through its mask (`rollout_keep`: numerator and
    denominator), not through this weight. low applies to mask only (truncate has no lower end).
    cap <= 0: all ones (no correction).
    """
    m = mask.bool()
    ones = torch.ones_like(logp)
    if cap <= 0:
        return ones, torch.zeros_like(m)
    w = torch.exp(log_ratio(logp.detach(), engine_logp, m, Level(level)))  # [N, L]; 1 off the mask
    truncate = ISMode(mode) is ISMode.truncate
    out = ((w > cap) | (w < (0.0 if truncate else low))) & m  # [N, L]
    kept = ones if in_ratio else w  # [N, L]
    if truncate:
        return torch.where(out, cap / w if in_ratio else torch.full_like(w, cap), kept), out
    return kept, out


def corrects_by_mask(algo: AlgoConfig) -> bool:
    """Whether the rollout correction drops tokens or sequences by the trainer's logprobs before the update (so a
    learner needs them to know the loss's denominator before any backward): sequence masking, the IS mask, or
    outlier rejection."""
    return algo.seq_mask_cap > 0 or (algo.tis_cap > 0 and (ISMode(algo.tis_mode) is ISMode.mask or algo.tis_seq_reject))


def rollout_keep(trainer: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                 algo: AlgoConfig) -> torch.Tensor:
    """[N, L] bool: the response tokens the loss keeps, in its numerator and its denominator alike. Left out:
      sequence mask   (algo.seq_mask_cap) every token of a sequence whose mean |log ratio| exceeds log(cap)
      IS mask         (algo.tis_mode=mask) tokens, or whole sequences at tis_level=sequence, whose weight
                      w = trainer / engine lies outside [tis_low, tis_cap]
      outlier reject  (algo.tis_seq_reject) every token of a sequence any of whose tokens' w lies outside
                      [tis_low, tis_cap]
    trainer: the trainer's logprobs before the update [N, L]. A non-finite weight is kept (it must reach the loss
    and trip the learner's non-finite guard rather than be dropped)."""
    m = mask.bool()
    keep = m & sequence_keep(trainer, engine_logp, m, algo.seq_mask_cap).unsqueeze(-1)  # [N, L]
    if algo.tis_cap <= 0:
        return keep
    if ISMode(algo.tis_mode) is ISMode.mask:
        _, out = is_weight(trainer, engine_logp, m, algo.tis_cap, algo.tis_level, ISMode.mask, low=algo.tis_low)
        keep = keep & ~out
    if algo.tis_seq_reject:
        _, out = is_weight(trainer, engine_logp, m, algo.tis_cap, Level.token, ISMode.mask, low=algo.tis_low)
        keep = keep & ~out.any(dim=-1, keepdim=True)
    return keep


def ratio_metrics(ratio: torch.Tensor, clip_active: torch.Tensor, out: torch.Tensor, m: torch.Tensor,
                  loss_mask: torch.Tensor) -> dict[str, float | Reduced]:
    """A loss's metrics, each with its reduction (rlgen.metrics.reduce; a plain number is a mean over response
    tokens). ratio, clip_active, out, m, loss_mask: [N, L] (m bool: the response mask; loss_mask:
    rollout_keep's). clip_frac is the fraction of the tokens under the loss mask whose clip is active; tis_frac
    the fraction of the response tokens whose IS weight lay outside the band (truncated or masked);
    seq_masked_frac the fraction of sequences with >= 1 response token of which the loss kept none; ratio_mean
    and ratio_max are of the ratio over the response tokens."""
    loss_mask = loss_mask.bool()
    loss_tokens = max(int(loss_mask.sum().item()), 1)
    tokens = int(m.sum().item())
    seqs = m.any(dim=-1)  # [N]
    r = ratio.detach()[m]  # [tokens]
    return {
        "clip_frac": Reduced(float((clip_active & loss_mask).sum().item()) / loss_tokens, LOSS_TOKEN_MEAN),
        "tis_frac": float((out & m).sum().item()) / max(tokens, 1),
        "seq_masked_frac": Reduced(float((seqs & ~loss_mask.any(dim=-1)).sum().item())
                                   / max(int(seqs.sum().item()), 1), SEQ_MEAN),
        "ratio_mean": float(r.mean().item()) if tokens else 1.0,
        "ratio_max": Reduced(float(r.max().item()) if tokens else 1.0, MAX),
    }


def is_correction(inputs: LossInputs, algo: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine/trainer IS correction of a micro-batch as algo.tis_* say (is_weight of the trainer's logprobs
    before the update against the engine's; in the ratio when algo.old_logprobs=engine): (weight [n, L], over
    [n, L] bool)."""
    return is_weight(inputs.trainer_before(), inputs.engine_logp, inputs.mask.bool(), algo.tis_cap, algo.tis_level,
                     algo.tis_mode, in_ratio=OldLogprobs(algo.old_logprobs) is OldLogprobs.engine, low=algo.tis_low)


def cap_in_ratio(algo: AlgoConfig) -> bool:
    """Whether is_correction's weight caps a ratio that carries the mismatch itself (old_logprobs=engine with
    tis_mode=truncate): ratio * weight is the ratio with each w above the cap counted as the cap."""
    return OldLogprobs(algo.old_logprobs) is OldLogprobs.engine and ISMode(algo.tis_mode) is ISMode.truncate


def corrected_loss(values: torch.Tensor, ratio: torch.Tensor, clip_active: torch.Tensor, inputs: LossInputs,
                   algo: AlgoConfig, correction: tuple[torch.Tensor, torch.Tensor] | None = None) -> LossOutputs:
    """What every policy loss does after its per-token values [n, L]: the engine/trainer IS weight (algo.tis_*,
    against the trainer's logprobs before the update), the token weight, the rollout correction's mask
    (rollout_keep: sequence masking, the IS mask, outlier rejection), -aggregate as algo.loss_agg says over the
    tokens that mask keeps, and the metrics (ratio_metrics of ratio and clip_active, [n, L]). correction: the
    (weight, out) to apply instead of is_correction's (a loss that applied the cap itself passes a weight of ones
    and its out, for the metrics)."""
    m = inputs.mask.bool()  # [n, L]
    weight, out = is_correction(inputs, algo) if correction is None else correction  # [n, L]
    values = values * weight
    if inputs.token_weight is not None:
        values = values * inputs.token_weight
    loss_mask = rollout_keep(inputs.trainer_before(), inputs.engine_logp, m, algo)  # [n, L]
    loss = -aggregate(values, loss_mask, algo.loss_agg, algo.max_new_tokens, denominator=inputs.denominator)
    return LossOutputs(loss, ratio_metrics(ratio, clip_active, out, m, loss_mask))


def check_advantages(advantages: torch.Tensor, logp: torch.Tensor) -> None:
    """Raises AdvantageShapeError unless advantages gives one value per sequence of logp [N, L] ([N]) or, under
    on-policy distillation, one per token ([N, L])."""
    if advantages.shape not in ((logp.shape[0],), tuple(logp.shape)):
        raise AdvantageShapeError(
            f"the advantages have shape {list(advantages.shape)}, but the batch has {logp.shape[0]} sequences: an "
            f"algorithm's advantages must give one value per sequence, shape [{logp.shape[0]}].")


def broadcast_advantages(advantages: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """The advantages checked (check_advantages) and shaped to broadcast over logp [N, L] in its dtype: [N, 1] for
    one per sequence, [N, L] for one per token."""
    check_advantages(advantages, logp)
    adv = advantages.to(logp.dtype)
    return adv.unsqueeze(-1) if adv.dim() == 1 else adv


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


__all__ = ["AdvantageShapeError", "aggregate", "broadcast_advantages", "cap_in_ratio", "check_advantages",
           "corrected_loss", "corrects_by_mask", "is_correction", "is_weight", "kl_estimate", "kl_k3", "log_ratio",
           "normaliser", "ratio_metrics", "rollout_keep", "sequence_keep", "token_entropy", "token_logprobs",
           "top_entropy_mask"]
