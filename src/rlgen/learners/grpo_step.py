"""The training step shared by the learners: batch tensors, the response forward, one micro-batch's loss and
metric sums, their accumulation over a batch, and the metrics `train_step` returns.

What a learner adds is how the gradients of `MicroLoss.total` are taken and applied (plain backward and
AdamW, or a DeepSpeed engine) and its non-finite guard.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlgen.algo.inputs import LossInputs
from rlgen.algo.loss import (
    aggregate,
    kl_estimate,
    normaliser,
    sequence_keep,
    token_entropy,
    token_logprobs,
    top_entropy_mask,
)
from rlgen.algo.registry import Loss
from rlgen.config import AlgoConfig, LossAgg, OldLogprobs
from rlgen.metrics.mismatch import mismatch_metrics
from rlgen.types import Phase, RolloutBatch


@dataclass(frozen=True)
class StepBatch:
    """A rollout batch's tensors on the learner's device, checked for shape."""

    ids: torch.Tensor  # [N, P+L]
    attn: torch.Tensor  # [N, P+L]
    mask: torch.Tensor  # [N, L] bool
    engine_logp: torch.Tensor  # [N, L] float32
    advantages: torch.Tensor  # [N] float32
    prompt_len: int
    micro: int  # rows per micro-batch
    old_logp: torch.Tensor | None = None  # [N, L] float32: the trainer's before the update (old_logprobs=trainer)

    @property
    def n_rows(self) -> int:
        return self.ids.shape[0]

    @property
    def resp_len(self) -> int:
        return self.ids.shape[1] - self.prompt_len

    def micro_slices(self) -> list[slice]:
        """The row ranges of the micro-batches, in order."""
        return [slice(lo, lo + self.micro) for lo in range(0, self.n_rows, self.micro)]

    def rows(self, r: slice) -> tuple[torch.Tensor, ...]:
        """(ids, attn, mask, engine_logp, advantages, old_logp) of rows r; old_logp is the trainer's logprobs
        before the update (algo.old_logprobs=trainer), or None: the ratio's pi_old is engine_logp."""
        old = None if self.old_logp is None else self.old_logp[r]
        return self.ids[r], self.attn[r], self.mask[r], self.engine_logp[r], self.advantages[r], old


def unpack_batch(batch: RolloutBatch, device: torch.device, micro_batch_size: int) -> StepBatch:
    """The batch's tensors on device; micro_batch_size 0 means one micro-batch of all rows.

    Raises ValueError when the response mask does not match input_ids and prompt_len.
    """
    ids = batch.input_ids.to(device)  # [N, P+L]
    attn = batch.attention_mask.to(device)  # [N, P+L]
    mask = batch.response_mask.to(device) > 0  # [N, L]
    engine_logp = batch.engine_logprobs.to(device, torch.float32)  # [N, L]
    advantages = batch.advantages.to(device, torch.float32)  # [N]
    n_rows, prompt_len = ids.shape[0], batch.prompt_len
    resp_len = ids.shape[1] - prompt_len
    if prompt_len < 1 or resp_len < 1 or mask.shape != (n_rows, resp_len):
        raise ValueError(
            f"bad batch: input_ids {tuple(ids.shape)}, prompt_len {prompt_len}, response_mask {tuple(mask.shape)}"
        )
    micro = micro_batch_size if micro_batch_size > 0 else n_rows
    return StepBatch(ids, attn, mask, engine_logp, advantages, prompt_len, micro)


# -- forward -----------------------------------------------------------------------------------------------


def response_logits(
    model: nn.Module, ids: torch.Tensor, attn: torch.Tensor, resp_len: int, temperature: float
) -> torch.Tensor:
    """Logits that predict the response tokens: ids, attn [n, P+L] -> [n, L, V] float32.

    Logits at column t predict token t+1, so columns P-1 .. P+L-2 are kept and the last column is not
    fed. Position ids count real tokens only (cumsum(attn) - 1, clamped at 0), so a left-padded prompt
    sees the positions it would see unpadded. Logits are divided by temperature (when > 0), as the
    engine's reported logprobs are of the temperature-scaled distribution it sampled from.
    """
    positions = (attn.cumsum(dim=-1) - 1).clamp(min=0)  # [n, P+L]
    out = model(
        input_ids=ids[:, :-1],
        attention_mask=attn[:, :-1],
        position_ids=positions[:, :-1],
        logits_to_keep=resp_len,
        use_cache=False,
    )
    logits = out.logits.float()  # [n, L, V]
    if temperature > 0 and temperature != 1.0:  # <= 0 means greedy: raw logits
        logits = logits / temperature
    return logits


def policy_logprobs(
    model: nn.Module,
    ids: torch.Tensor,
    attn: torch.Tensor,
    mask: torch.Tensor,
    engine_logp: torch.Tensor,
    prompt_len: int,
    algo: AlgoConfig,
    old_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits [n, L, V], trainer logprobs [n, L], loss mask [n, L]) for ids, attn [n, P+L] and mask,
    engine_logp [n, L]. The loss mask is the response mask less the sequences that sequence masking
    (algo.seq_mask_cap) drops, judged on the trainer's logprobs before the update: old_logp [n, L] when
    given (old_logprobs=trainer), else the current ones (equal before the update)."""
    logits = response_logits(model, ids, attn, mask.shape[1], algo.temperature)  # [n, L, V]
    logp = token_logprobs(logits, ids[:, prompt_len:])  # [n, L]
    before = logp.detach() if old_logp is None else old_logp  # [n, L]
    keep = sequence_keep(before, engine_logp, mask, algo.seq_mask_cap)  # [n]
    return logits, logp, mask & keep.unsqueeze(-1)


def with_old_logprobs(model: nn.Module, step: StepBatch, algo: AlgoConfig) -> StepBatch:
    """algo.old_logprobs=trainer: the step with the trainer's own logprobs of every row, from a no-grad forward
    of each micro-batch before any backward (so before the step's optimizer step; each learner rank does its
    own rows). Otherwise the step as it is: the ratio's pi_old is the engine's logprobs."""
    if OldLogprobs(algo.old_logprobs) is not OldLogprobs.trainer:
        return step
    old = torch.zeros_like(step.engine_logp)  # [N, L]
    with torch.no_grad():
        for r in step.micro_slices():
            logits = response_logits(model, step.ids[r], step.attn[r], step.resp_len, algo.temperature)  # [n, L, V]
            old[r] = token_logprobs(logits, step.ids[r, step.prompt_len:])
    return dataclasses.replace(step, old_logp=old)


def batch_denominator(model: nn.Module, step: StepBatch, algo: AlgoConfig, agg: LossAgg) -> float:
    """The whole batch's loss denominator before any backward: from the response mask, or (sequence
    masking on) from the loss mask after a no-grad forward of each micro-batch."""
    if algo.seq_mask_cap <= 0:
        return normaliser(step.mask, agg, algo.max_new_tokens)
    total = 0.0
    with torch.no_grad():
        for r in step.micro_slices():
            if step.old_logp is not None:  # the trainer's logprobs are there already: no forward
                keep = sequence_keep(step.old_logp[r], step.engine_logp[r], step.mask[r], algo.seq_mask_cap)  # [n]
                loss_mask = step.mask[r] & keep.unsqueeze(-1)
            else:
                _, _, loss_mask = policy_logprobs(
                    model, step.ids[r], step.attn[r], step.mask[r], step.engine_logp[r], step.prompt_len, algo
                )  # [n, L]
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
    logits: torch.Tensor  # [n, L, V]
    logp: torch.Tensor  # [n, L], with grad
    mask: torch.Tensor  # [n, L] bool
    loss_mask: torch.Tensor  # [n, L] bool
    metrics: dict[str, float]  # the algorithm's loss metrics (those it reports)

    def sums(self) -> dict[str, float]:
        """pg, kl, entropy, denom, and token/sequence-weighted metric sums; ratio_max is this micro-batch's
        maximum (-inf without response tokens). Call after backward: the entropy needs a [n, L, V]
        softmax."""
        with torch.no_grad():
            entropy = token_entropy(self.logits)  # [n, L]
        metrics, mask = self.metrics, self.mask
        loss_tokens, tokens = float(self.loss_mask.sum().item()), float(mask.sum().item())
        seqs = float(mask.any(dim=-1).sum().item())
        return {
            "pg": self.pg,
            "kl": self.kl,
            "ent": self.ent,
            "entropy": float(entropy[mask].sum().item()),
            "denom": self.denom,
            "loss_tokens": loss_tokens,
            "clip": metrics.get("clip_frac", 0.0) * loss_tokens,
            "tis": metrics.get("tis_frac", 0.0) * loss_tokens,
            "ratio": metrics.get("ratio_mean", 1.0) * tokens,
            "ratio_max": metrics.get("ratio_max", 1.0) if tokens else -math.inf,
            "masked_seqs": metrics.get("seq_masked_frac", 0.0) * seqs,
        }


def micro_loss(
    model: nn.Module,
    ref_model: nn.Module | None,
    ids: torch.Tensor,
    attn: torch.Tensor,
    mask: torch.Tensor,
    engine_logp: torch.Tensor,
    advantages: torch.Tensor,
    prompt_len: int,
    algo: AlgoConfig,
    agg: LossAgg,
    loss_fn: Loss,
    old_logp: torch.Tensor | None = None,
) -> MicroLoss:
    """The loss of one micro-batch, summed over tokens/sequences (denominator 1): the algorithm's policy loss
    (loss_fn, rlgen.algo.registry), plus algo.kl_coef times the KL to ref_model (the learner passes it only when
    the KL goes in the loss), minus algo.entropy_coef times the aggregated token entropy. With
    algo.entropy_top_frac < 1 only this micro-batch's highest-entropy tokens get a policy gradient.

    ids, attn: [n, P+L]; mask, engine_logp: [n, L] (mask bool); advantages: [n]; old_logp: [n, L], the trainer's
    logprobs before the update (StepBatch.old_logp), or None: the ratio's pi_old is engine_logp.
    """
    logits, logp, loss_mask = policy_logprobs(model, ids, attn, mask, engine_logp, prompt_len, algo, old_logp)
    bonus = algo.entropy_coef > 0
    entropy = token_entropy(logits) if bonus else None  # [n, L], with grad
    token_weight = None
    if algo.entropy_top_frac < 1.0:
        if entropy is None:
            with torch.no_grad():
                entropy = token_entropy(logits)
        token_weight = top_entropy_mask(entropy, loss_mask, algo.entropy_top_frac)  # [n, L]
    inputs = LossInputs(logp=logp, old_logp=engine_logp if old_logp is None else old_logp, engine_logp=engine_logp,
                        advantages=advantages, mask=mask, token_weight=token_weight, denominator=1.0,
                        old_from_trainer=old_logp is not None)
    out = loss_fn(inputs, algo)
    pg, metrics = out.loss, out.metrics
    total, kl_sum, ent_sum = pg, 0.0, 0.0
    if ref_model is not None:
        kl = aggregate(token_kl(logp, engine_logp, reference_logprobs(ref_model, ids, attn, mask.shape[1], prompt_len,
                                                                      algo), algo),
                       loss_mask, agg, algo.max_new_tokens, denominator=1.0)
        total = total + algo.kl_coef * kl
        kl_sum = float(kl.item())
    if bonus:
        ent = aggregate(entropy, loss_mask, agg, algo.max_new_tokens, denominator=1.0)
        total = total - algo.entropy_coef * ent
        ent_sum = float(ent.item())
    return MicroLoss(
        total=total,
        pg=float(pg.item()),
        kl=kl_sum,
        ent=ent_sum,
        denom=normaliser(loss_mask, agg, algo.max_new_tokens),
        logits=logits,
        logp=logp,
        mask=mask,
        loss_mask=loss_mask,
        metrics=metrics,
    )


def reference_logprobs(ref_model: nn.Module, ids: torch.Tensor, attn: torch.Tensor, resp_len: int, prompt_len: int,
                       algo: AlgoConfig) -> torch.Tensor:
    """The frozen reference model's logprobs of the response tokens, without gradient: [n, L]."""
    with torch.no_grad():
        ref_logits = response_logits(ref_model, ids, attn, resp_len, algo.temperature)  # [n, L, V]
        return token_logprobs(ref_logits, ids[:, prompt_len:])  # [n, L]


def token_kl(logp: torch.Tensor, engine_logp: torch.Tensor, ref_logp: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """Per-token KL(policy || ref) by algo.kl_estimator; with algo.kl_bias_correction, times the token's
    importance ratio exp(logp - engine_logp) (the tokens were sampled by the engine). [n, L] each -> [n, L]."""
    kl = kl_estimate(logp, ref_logp, algo.kl_estimator)
    if algo.kl_bias_correction:
        kl = kl * torch.exp(torch.where(torch.isfinite(engine_logp), logp - engine_logp, torch.zeros_like(logp)))
    return kl


def sequence_kl(ref_model: nn.Module, step: StepBatch, algo: AlgoConfig) -> torch.Tensor:
    """For the KL in the reward (algo.kl_penalty=reward): each sequence's summed per-token KL between the engine's
    policy, which sampled it, and the reference, by algo.kl_estimator: [N]. No gradient; one reference forward
    per micro-batch."""
    out = torch.zeros(step.n_rows, device=step.ids.device)  # [N]
    for r in step.micro_slices():
        ids, attn, mask, engine_logp, _, _ = step.rows(r)
        ref_logp = reference_logprobs(ref_model, ids, attn, mask.shape[1], step.prompt_len, algo)  # [n, L]
        kl = kl_estimate(engine_logp, ref_logp, algo.kl_estimator)  # [n, L]
        out[r] = torch.where(mask, kl, torch.zeros_like(kl)).sum(dim=-1)
    return out


# -- the batch ---------------------------------------------------------------------------------------------


class StepSums:
    """Micro-batch results gathered over a batch: trainer logprobs, summed metrics, ratio maxima."""

    def __init__(self, step: StepBatch) -> None:
        self.trainer_logp = torch.zeros(step.n_rows, step.resp_len, device=step.ids.device)  # [N, L]
        self.totals: dict[str, float] = {}
        self.ratio_maxes: list[float] = []

    def add(self, rows: slice, logp: torch.Tensor, sums: dict[str, float]) -> None:
        """Record one micro-batch: logp [n, L] (detached) and its `MicroLoss.sums()`."""
        self.trainer_logp[rows] = logp
        for key, value in sums.items():
            if key == "ratio_max":
                self.ratio_maxes.append(value)
            else:
                self.totals[key] = self.totals.get(key, 0.0) + value

    def get(self, key: str) -> float:
        """A running sum (0.0 before any micro-batch)."""
        return self.totals.get(key, 0.0)

    def losses(self, scale: float, algo: AlgoConfig) -> tuple[float, float, float]:
        """(pg_loss, kl, loss) of the batch, the sums multiplied by scale = 1 / denominator."""
        pg_loss, kl_value = self.get("pg") * scale, self.get("kl") * scale
        return pg_loss, kl_value, pg_loss + algo.kl_coef * kl_value - algo.entropy_coef * self.get("ent") * scale


def inverse(denom: float) -> float:
    """1 / denom, or 0.0 for an empty denominator (no loss tokens or sequences)."""
    return 1.0 / denom if denom > 0 else 0.0


def assemble_metrics(
    step: StepBatch,
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
) -> dict[str, Any]:
    """The dict `Learner.train_step` returns. kl_value None: no reference model (no "kl" key). reason: why
    the step was skipped, None when applied. Mismatch metrics compare the trainer logprobs gathered before
    the update with the engine's."""
    mismatch = mismatch_metrics(sums.trainer_logp, step.engine_logp, step.mask, delta_threshold)
    acc, mask = sums.totals, step.mask
    tokens = int(mask.sum().item())
    loss_tokens = max(acc["loss_tokens"], 1.0)
    seqs = max(int(mask.any(dim=-1).sum().item()), 1)
    ratio_max = float(torch.tensor(sums.ratio_maxes).max())  # nan propagates
    out: dict[str, Any] = {
        "loss": loss,
        "pg_loss": pg_loss,
        "grad_norm": grad_norm,
        "entropy": acc["entropy"] / max(tokens, 1),
        "clip_frac": acc["clip"] / loss_tokens,
        "tis_frac": acc["tis"] / loss_tokens,
        "seq_masked_frac": acc["masked_seqs"] / seqs,
        "ratio_mean": acc["ratio"] / tokens if tokens else 1.0,
        "ratio_max": ratio_max if tokens else 1.0,
        "response_tokens": tokens,
        "sequences": int(mask.any(dim=-1).sum().item()),  # with at least one response token
        "loss_tokens": int(acc["loss_tokens"]),  # under the loss after sequence masking
        "version": version,
        "skipped": reason is not None,
    }
    if kl_value is not None:
        out["kl"] = kl_value
    if step.ids.is_cuda:  # the learner's peak GPU memory so far (torch's allocator), for memory records
        out["learner_peak_gib"] = torch.cuda.max_memory_allocated(step.ids.device) / 2**30
    if reason is not None:
        out["skip_reason"] = reason
    out.update({f"mismatch/{k}": v for k, v in mismatch.items()})
    out["spans"] = [(Phase.train.value, start, time.time())]
    return out


__all__ = [
    "MicroLoss",
    "StepBatch",
    "StepSums",
    "assemble_metrics",
    "batch_denominator",
    "inverse",
    "micro_loss",
    "policy_logprobs",
    "reference_logprobs",
    "response_logits",
    "sequence_kl",
    "token_kl",
    "unpack_batch",
    "with_old_logprobs",
]
