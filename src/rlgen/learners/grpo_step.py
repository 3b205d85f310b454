"""The training step shared by the learners: the response forward of a token batch's packed micro-batches
(rlgen.learners.token_batch), one micro-batch's loss and metric sums, their accumulation over a batch, and the
result `train_step` returns.

`StepCore` (rlgen.learners.step_core) runs these for a learner; what a learner adds is how the gradients of
`MicroLoss.total` are taken and applied (plain backward and AdamW, or a DeepSpeed engine) and its non-finite guard.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlgen.algo.distill import full_reverse_kl
from rlgen.algo.inputs import LossInputs
from rlgen.algo.loss import (
    aggregate,
    corrects_by_mask,
    kl_estimate,
    normaliser,
    rollout_keep,
    top_entropy_mask,
)
from rlgen.algo.registry import Loss
from rlgen.config import AlgoConfig, LossAgg, OldLogprobs
from rlgen.learners.packed import Packed, packed_forward, packed_forward_taught
from rlgen.learners.token_batch import Micro, TokenBatch
from rlgen.metrics.mismatch import MISMATCH_REDUCTIONS, mismatch_by_length, mismatch_metrics, response_lengths
from rlgen.metrics.reduce import MAX, SUM, TOKEN_MEAN, MicroMetrics, Reduced
from rlgen.types import Phase, StepResult

# -- forward -----------------------------------------------------------------------------------------------


def policy_logprobs(
    model: nn.Module, micro: Micro, algo: AlgoConfig, entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(trainer logprobs [n, Lm], entropies [n, Lm], loss mask [n, Lm]) of a micro-batch's response tokens. The
    loss mask is the response mask less what the rollout correction drops (algo.loss.rollout_keep: sequence
    masking, the IS mask, outlier rejection), judged on the trainer's logprobs before the update: micro.old_logp
    when given (old_logprobs=trainer), else the current ones (equal before the update). The entropies carry
    gradients only with entropy_grad."""
    logp, entropy = packed_forward(model, micro.packed, algo.temperature, entropy_grad)  # [n, Lm] each
    return logp, entropy, _loss_mask(logp, micro, algo)


def _loss_mask(logp: torch.Tensor, micro: Micro, algo: AlgoConfig) -> torch.Tensor:
    before = logp.detach() if micro.old_logp is None else micro.old_logp  # [n, Lm]
    return rollout_keep(before, micro.engine_logp, micro.mask, algo)


def with_old_logprobs(model: nn.Module, step: TokenBatch, algo: AlgoConfig) -> TokenBatch:
    """algo.old_logprobs=trainer: the step with the trainer's own logprobs of every row, from a no-grad forward
    of each micro-batch before any backward (so before the step's optimizer step; each learner rank does its
    own rows). Otherwise the step as it is: the ratio's pi_old is the engine's logprobs."""
    if OldLogprobs(algo.old_logprobs) is not OldLogprobs.trainer:
        return step
    old = torch.zeros_like(step.engine_logp)  # [N, L]
    with torch.no_grad():
        for micro in step.micros():
            logp, _ = packed_forward(model, micro.packed, algo.temperature)  # [n, Lm]
            old[micro.rows, : logp.shape[1]] = logp
    return dataclasses.replace(step, old_logp=old)


def batch_denominator(model: nn.Module, step: TokenBatch, algo: AlgoConfig, agg: LossAgg) -> float:
    """The whole batch's loss denominator before any backward: from the response mask, or (where the rollout
    correction drops tokens by the trainer's logprobs: algo.loss.corrects_by_mask) from the loss mask, after a
    no-grad forward of each micro-batch unless the trainer's logprobs are there already."""
    if not corrects_by_mask(algo):
        return normaliser(step.mask, agg, algo.max_new_tokens)
    total = 0.0
    with torch.no_grad():
        for micro in step.micros():
            if micro.old_logp is not None:  # the trainer's logprobs are there already: no forward
                loss_mask = rollout_keep(micro.old_logp, micro.engine_logp, micro.mask, algo)  # [n, Lm]
            else:
                _, _, loss_mask = policy_logprobs(model, micro, algo)  # [n, Lm]
            total += normaliser(loss_mask, agg, algo.max_new_tokens)
    return total


# -- one micro-batch ---------------------------------------------------------------------------------------


@dataclass
class MicroLoss:
    """One micro-batch's loss, undivided (denominator 1), before backward."""

    total: torch.Tensor  # [] pg + kl_coef * kl - entropy_coef * ent, with grad
    pg: float  # the policy-gradient sum
    kl: float  # the KL sum (0.0 without a reference model, or with the KL in the reward)
    ent: float  # the aggregated entropy sum (0.0 without an entropy bonus)
    denom: float  # this micro-batch's share of the aggregate's denominator
    entropy: torch.Tensor  # [n, Lm] each response token's entropy
    logp: torch.Tensor  # [n, Lm], with grad
    mask: torch.Tensor  # [n, Lm] bool
    loss_mask: torch.Tensor  # [n, Lm] bool
    metrics: dict[str, float | Reduced]  # the algorithm's loss metrics, each with its reduction
    distill: float = 0.0  # the teacher's aggregated whole reverse KL sum (algo.distill_estimator=full), else 0.0

    def sums(self) -> dict[str, float]:
        """pg, kl, entropy, denom, and the micro-batch's counts its loss metrics' means weigh by (MICRO_COUNTS)."""
        mask = self.mask
        return {
            "pg": self.pg,
            "kl": self.kl,
            "ent": self.ent,
            "distill": self.distill,
            "entropy": float(self.entropy.detach()[mask].sum().item()),
            "denom": self.denom,
            "loss_tokens": float(self.loss_mask.sum().item()),
            "response_tokens": float(mask.sum().item()),
            "sequences": float(mask.any(dim=-1).sum().item()),
        }


def micro_loss(
    model: nn.Module,
    ref_model: nn.Module | None,
    micro: Micro,
    algo: AlgoConfig,
    agg: LossAgg,
    loss_fn: Loss,
    teacher: nn.Module | None = None,
) -> MicroLoss:
    """The loss of one micro-batch, summed over tokens/sequences (denominator 1): the algorithm's policy loss
    (loss_fn, rlgen.algo.registry), plus algo.kl_coef times the KL to ref_model (the learner passes it only when
    the KL goes in the loss), minus algo.entropy_coef times the aggregated token entropy. With
    algo.entropy_top_frac < 1 only this micro-batch's highest-entropy tokens get a policy gradient. The ratio's
    pi_old is micro.old_logp (old_logprobs=trainer), or else the engine's logprobs. teacher (on-policy
    distillation with algo.distill_estimator=full): plus algo.distill_coef times the aggregated reverse KL to it
    over the whole vocabulary at each response token (rlgen.algo.distill)."""
    bonus = algo.entropy_coef > 0
    taught = None
    if teacher is None:
        logp, entropy, loss_mask = policy_logprobs(model, micro, algo, entropy_grad=bonus)  # [n, Lm] each
    else:
        logp, entropy, taught = packed_forward_taught(model, teacher, micro.packed, algo.temperature, bonus)
        loss_mask = _loss_mask(logp, micro, algo)  # [n, Lm]
    token_weight = None
    if algo.entropy_top_frac < 1.0:
        token_weight = top_entropy_mask(entropy.detach(), loss_mask, algo.entropy_top_frac)  # [n, Lm]
    old = micro.old_logp
    inputs = LossInputs(logp=logp, old_logp=micro.engine_logp if old is None else old, engine_logp=micro.engine_logp,
                        advantages=micro.loss_advantages(), mask=micro.mask, token_weight=token_weight, denominator=1.0,
                        old_from_trainer=old is not None)
    out = loss_fn(inputs, algo)
    pg, metrics = out.loss, out.metrics
    total, kl_sum, ent_sum = pg, 0.0, 0.0
    if ref_model is not None:
        ref_logp = reference_logprobs(ref_model, micro.packed, algo)  # [n, Lm]
        kl = aggregate(token_kl(logp, micro.engine_logp, ref_logp, algo), loss_mask, agg, algo.max_new_tokens,
                       denominator=1.0)
        total = total + algo.kl_coef * kl
        kl_sum = float(kl.item())
    if bonus:
        ent = aggregate(entropy, loss_mask, agg, algo.max_new_tokens, denominator=1.0)
        total = total - algo.entropy_coef * ent
        ent_sum = float(ent.item())
    distill_sum = 0.0
    if taught is not None:
        distill = aggregate(taught, loss_mask, agg, algo.max_new_tokens, denominator=1.0)
        total = total + algo.distill_coef * distill
        distill_sum = float(distill.item())
        metrics = {**metrics, **full_reverse_kl(taught, micro.mask)}
    return MicroLoss(
        total=total,
        pg=float(pg.item()),
        kl=kl_sum,
        ent=ent_sum,
        denom=normaliser(loss_mask, agg, algo.max_new_tokens),
        entropy=entropy,
        logp=logp,
        mask=micro.mask,
        loss_mask=loss_mask,
        metrics=metrics,
        distill=distill_sum,
    )


def reference_logprobs(ref_model: nn.Module, packed: Packed, algo: AlgoConfig) -> torch.Tensor:
    """The frozen reference model's logprobs of a packed micro-batch's response tokens, without gradient:
    [n, Lm]."""
    with torch.no_grad():
        return packed_forward(ref_model, packed, algo.temperature)[0]


def token_kl(logp: torch.Tensor, engine_logp: torch.Tensor, ref_logp: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """Per-token KL(policy || ref) by algo.kl_estimator; with algo.kl_bias_correction, times the token's
    importance ratio exp(logp - engine_logp) (the tokens were sampled by the engine). [n, L] each -> [n, L]."""
    kl = kl_estimate(logp, ref_logp, algo.kl_estimator)
    if algo.kl_bias_correction:
        kl = kl * torch.exp(torch.where(torch.isfinite(engine_logp), logp - engine_logp, torch.zeros_like(logp)))
    return kl


def sequence_kl(ref_model: nn.Module, step: TokenBatch, algo: AlgoConfig) -> torch.Tensor:
    """For the KL in the reward (algo.kl_penalty=reward): each sequence's summed per-token KL between the engine's
    policy, which sampled it, and the reference, by algo.kl_estimator: [N]. No gradient; one reference forward
    per micro-batch."""
    out = torch.zeros(step.n_rows, device=step.device)  # [N]
    for micro in step.micros():
        ref_logp = reference_logprobs(ref_model, micro.packed, algo)  # [n, Lm]
        kl = kl_estimate(micro.engine_logp, ref_logp, algo.kl_estimator)  # [n, Lm]
        out[micro.rows] = torch.where(micro.mask, kl, torch.zeros_like(kl)).sum(dim=-1)
    return out


# -- the batch ---------------------------------------------------------------------------------------------


class StepSums:
    """Micro-batch results gathered over a batch: trainer logprobs, summed losses and counts, and the loss's
    metrics by their reductions (rlgen.metrics.reduce)."""

    def __init__(self, step: TokenBatch) -> None:
        self.trainer_logp = torch.zeros(step.n_rows, step.resp_len, device=step.device)  # [N, L]
        self.totals: dict[str, float] = {}
        self.metrics = MicroMetrics()

    def add(self, rows: torch.Tensor, logp: torch.Tensor, sums: dict[str, float],
            metrics: dict[str, float | Reduced] | None = None) -> None:
        """Record one micro-batch: its rows [n], logp [n, Lm] (detached), its `MicroLoss.sums()` and the loss's
        metrics (MicroLoss.metrics)."""
        self.trainer_logp[rows, : logp.shape[1]] = logp
        for key, value in sums.items():
            self.totals[key] = self.totals.get(key, 0.0) + value
        self.metrics.add(metrics or {}, sums)

    def get(self, key: str) -> float:
        """A running sum (0.0 before any micro-batch)."""
        return self.totals.get(key, 0.0)

    def losses(self, scale: float, algo: AlgoConfig) -> tuple[float, float, float]:
        """(pg_loss, kl, loss) of the batch, the sums multiplied by scale = 1 / denominator; the loss holds the
        teacher's whole reverse KL too (algo.distill_estimator=full)."""
        pg_loss, kl_value = self.get("pg") * scale, self.get("kl") * scale
        return pg_loss, kl_value, (pg_loss + algo.kl_coef * kl_value - algo.entropy_coef * self.get("ent") * scale
                                   + algo.distill_coef * self.get("distill") * scale)


def inverse(denom: float) -> float:
    """1 / denom, or 0.0 for an empty denominator (no loss tokens or sequences)."""
    return 1.0 / denom if denom > 0 else 0.0


def step_result(
    step: TokenBatch,
    sums: StepSums,
    *,
    loss: float,
    pg_loss: float,
    kl_value: float | None,
    grad_norm: float,
    version: int,
    reason: str | None,
    delta_threshold: float,
    start: float,
    overflow: bool = False,
) -> StepResult:
    """What `Learner.train_step` returns: the policy version after the step, why it was skipped (reason; None
    when applied), its span and its metrics. kl_value None: no reference model (no "kl" key). Mismatch metrics
    compare the trainer logprobs gathered before the update with the engine's."""
    mismatch = mismatch_metrics(sums.trainer_logp, step.engine_logp, step.mask, delta_threshold)
    acc, mask = sums.totals, step.mask
    tokens = int(mask.sum().item())
    out: dict[str, Any] = {
        **sums.metrics.values(),  # the loss's own (clip_frac, tis_frac, ratio_max, ... and any a new loss adds)
        "loss": loss,
        "pg_loss": pg_loss,
        "grad_norm": grad_norm,
        "entropy": acc.get("entropy", 0.0) / max(tokens, 1),
        "response_tokens": tokens,
        "response_len_max": int(response_lengths(mask).max().item()) if mask.numel() else 0,  # the longest trained
        "sequences": int(mask.any(dim=-1).sum().item()),  # with at least one response token
        "loss_tokens": int(acc.get("loss_tokens", 0)),  # under the loss after sequence masking
        "packed_tokens": step.tokens,  # the tokens the micro-batches forwarded: prompts and kept responses
        "micro_batches": len(step.packs),
    }
    if kl_value is not None:
        out["kl"] = kl_value
    if step.device.type == "cuda":  # the learner's peak GPU memory so far (torch's allocator), for memory records
        out["learner_peak_gib"] = torch.cuda.max_memory_allocated(step.device) / 2**30
    out.update({f"mismatch/{k}": v for k, v in mismatch.items()})
    by_length = mismatch_by_length(sums.trainer_logp, step.engine_logp, step.mask, delta_threshold)
    out.update({f"mismatch/{k}": v for k, v in by_length.items()})
    reductions = {**sums.metrics.hows, **STEP_REDUCTIONS,
                  **{f"mismatch/{k}": v for k, v in MISMATCH_REDUCTIONS.items()}}
    return StepResult(version=version, skip_reason=reason, spans=((Phase.train.value, start, time.time()),),
                      metrics=out, overflow=overflow, reductions=reductions)


# how the step's own metrics merge over the learner group (rlgen.metrics.reduce); a key not here: rank 0's
STEP_REDUCTIONS = {
    "loss": SUM, "pg_loss": SUM, "kl": SUM,  # each rank's part of the whole batch's loss, over its denominator
    "response_tokens": SUM, "sequences": SUM, "loss_tokens": SUM, "packed_tokens": SUM,
    "entropy": TOKEN_MEAN, "response_len_max": MAX,
}


__all__ = [
    "STEP_REDUCTIONS",
    "MicroLoss",
    "StepSums",
    "batch_denominator",
    "inverse",
    "micro_loss",
    "policy_logprobs",
    "reference_logprobs",
    "sequence_kl",
    "step_result",
    "token_kl",
    "with_old_logprobs",
]
