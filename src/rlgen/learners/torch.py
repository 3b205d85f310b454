"""A single-process PyTorch learner: one GRPO optimizer step per rollout batch, with a non-finite guard."""

from __future__ import annotations

import copy
import math
import os
import time
from typing import Any

import torch
from torch import nn

from rlgen.algo.grpo import aggregate, kl_k3, normaliser, policy_loss, sequence_keep, token_logprobs
from rlgen.config import AlgoConfig, LossAgg, MonitorConfig
from rlgen.mismatch import mismatch_metrics
from rlgen.types import Phase, RolloutBatch


class NonFiniteWeightsError(RuntimeError):
    pass


def _disable_dropout(model: nn.Module) -> None:
    """Zero dropout modules and the float attention-dropout rates HF attention layers read in train mode."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


class TorchLearner:
    """Loads an HF causal LM in float32 and trains it with the GRPO loss of `rlgen.algo.grpo`.

    Constructor arguments are plain values so the class can be wrapped in `ray.remote`.
    num_threads: torch intra-op threads (1 by default: on a small CPU machine the engine runs beside it);
    None leaves torch's setting alone.
    """

    def __init__(
        self,
        model_path: str,
        algo: AlgoConfig,
        monitor: MonitorConfig,
        seed: int = 0,
        device: str = "cpu",
        rank: int = 0,
        name: str = "learner0",
        num_threads: int | None = 1,
    ) -> None:
        from transformers import AutoModelForCausalLM

        if num_threads:
            torch.set_num_threads(num_threads)
        torch.manual_seed(seed)
        self.algo = algo
        self.monitor = monitor
        self.device = torch.device(device)
        self.rank = rank
        self.name = name
        self.loss_agg = LossAgg(algo.loss_agg)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.device)
        self.model.train()
        _disable_dropout(self.model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=algo.lr, weight_decay=algo.weight_decay)
        self.ref_model: nn.Module | None = None
        if algo.kl_coef > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.version = 0
        self.calls = 0
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self.last_skip_reason: str | None = None

    # -- forward -------------------------------------------------------------------------------------------

    def _response_logits(
        self, model: nn.Module, ids: torch.Tensor, attn: torch.Tensor, resp_len: int
    ) -> torch.Tensor:
        """Logits that predict the response tokens: ids, attn [n, P+L] -> [n, L, V] float32.

        Logits at column t predict token t+1, so columns P-1 .. P+L-2 are kept and the last column is not
        fed. Position ids count real tokens only (cumsum(attn) - 1, clamped at 0), so a left-padded prompt
        sees the positions it would see unpadded. Logits are divided by algo.temperature (when > 0), as
        the engine's reported logprobs are of the temperature-scaled distribution it sampled from.
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
        if self.algo.temperature > 0 and self.algo.temperature != 1.0:  # <= 0 means greedy: raw logits
            logits = logits / self.algo.temperature
        return logits

    def _micro_backward(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor,
        mask: torch.Tensor,
        engine_logp: torch.Tensor,
        advantages: torch.Tensor,
        prompt_len: int,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Forward and backward of one micro-batch with the loss left undivided (denominator 1).

        ids, attn: [n, P+L]; mask, engine_logp: [n, L] (mask bool); advantages: [n]. Returns the detached
        trainer logprobs [n, L] and sums: pg, kl, entropy, denom (this micro-batch's share of the
        aggregate's denominator), and token/sequence-weighted metric sums.
        """
        algo = self.algo
        resp_len = mask.shape[1]
        targets = ids[:, prompt_len:]  # [n, L]
        logits = self._response_logits(self.model, ids, attn, resp_len)  # [n, L, V]
        logp = token_logprobs(logits, targets)  # [n, L]
        keep = sequence_keep(logp, engine_logp, mask, algo.seq_mask_cap)  # [n]
        loss_mask = mask & keep.unsqueeze(-1)  # [n, L]
        pg, metrics = policy_loss(
            logp,
            engine_logp,
            advantages,
            mask,
            clip_low=algo.clip_low,
            clip_high=algo.clip_high,
            tis_cap=algo.tis_cap,
            seq_mask_cap=algo.seq_mask_cap,
            agg=self.loss_agg,
            max_new_tokens=algo.max_new_tokens,
            denominator=1.0,
        )
        total, kl_sum = pg, 0.0
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logp = token_logprobs(self._response_logits(self.ref_model, ids, attn, resp_len), targets)
            kl = aggregate(
                kl_k3(logp, ref_logp), loss_mask, self.loss_agg, algo.max_new_tokens, denominator=1.0
            )
            total = pg + algo.kl_coef * kl
            kl_sum = float(kl.item())
        total.backward()

        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)  # [n, L, V]
            entropy = torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)  # [n, L]
            del probs
        loss_tokens, tokens = float(loss_mask.sum().item()), float(mask.sum().item())
        seqs = float(mask.any(dim=-1).sum().item())
        sums = {
            "pg": float(pg.item()),
            "kl": kl_sum,
            "entropy": float(entropy[mask].sum().item()),
            "denom": normaliser(loss_mask, self.loss_agg, algo.max_new_tokens),
            "loss_tokens": loss_tokens,
            "clip": metrics["clip_frac"] * loss_tokens,
            "tis": metrics["tis_frac"] * loss_tokens,
            "ratio": metrics["ratio_mean"] * tokens,
            "ratio_max": metrics["ratio_max"] if tokens else -math.inf,
            "masked_seqs": metrics["seq_masked_frac"] * seqs,
        }
        return logp.detach(), sums

    # -- training ------------------------------------------------------------------------------------------

    def train_step(self, batch: RolloutBatch) -> dict[str, Any]:
        """One optimizer step. See `Learner.train_step` for the returned keys.

        Micro-batches of algo.micro_batch_size rows (0: all rows) each backpropagate their loss summed
        over tokens/sequences (denominator 1); once all are done the gradients are divided by the whole
        batch's denominator (after sequence masking), so any split gives the whole-batch loss and gradient.
        Parameters do not change before optimizer.step(), so the mismatch metrics, gathered over the
        micro-batches, are those of the policy before the update.
        """
        start = time.time()
        step_index = self.calls
        self.calls += 1
        algo, dev = self.algo, self.device
        ids = batch.input_ids.to(dev)  # [N, P+L]
        attn = batch.attention_mask.to(dev)  # [N, P+L]
        mask = batch.response_mask.to(dev) > 0  # [N, L]
        engine_logp = batch.engine_logprobs.to(dev, torch.float32)  # [N, L]
        advantages = batch.advantages.to(dev, torch.float32)  # [N]
        n_rows, prompt_len = ids.shape[0], batch.prompt_len
        resp_len = ids.shape[1] - prompt_len
        if prompt_len < 1 or resp_len < 1 or mask.shape != (n_rows, resp_len):
            raise ValueError(
                f"bad batch: input_ids {tuple(ids.shape)}, prompt_len {prompt_len}, response_mask {tuple(mask.shape)}"
            )
        micro = algo.micro_batch_size if algo.micro_batch_size > 0 else n_rows

        self.optimizer.zero_grad(set_to_none=True)
        trainer_logp = torch.zeros(n_rows, resp_len, device=dev)  # [N, L]
        acc: dict[str, float] = {}
        ratio_maxes: list[float] = []
        for lo in range(0, n_rows, micro):
            rows = slice(lo, lo + micro)
            logp, sums = self._micro_backward(
                ids[rows], attn[rows], mask[rows], engine_logp[rows], advantages[rows], prompt_len
            )
            trainer_logp[rows] = logp
            ratio_maxes.append(sums.pop("ratio_max"))
            for key, value in sums.items():
                acc[key] = acc.get(key, 0.0) + value

        mismatch = mismatch_metrics(trainer_logp, engine_logp, mask, self.monitor.delta_threshold)
        denom = acc["denom"]
        if denom > 0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(denom)
        scale = 1.0 / denom if denom > 0 else 0.0
        pg_loss, kl_value = acc["pg"] * scale, acc["kl"] * scale
        loss = pg_loss + algo.kl_coef * kl_value
        max_norm = algo.grad_clip if algo.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm).item())

        if not math.isfinite(grad_norm):
            reason = f"non-finite gradient norm ({grad_norm}) at step {step_index}"
        elif not math.isfinite(loss):
            reason = f"non-finite loss ({loss}) at step {step_index}"
        else:
            reason = self._guarded_step(step_index)
        self.optimizer.zero_grad(set_to_none=True)
        if reason is None:
            self.version += 1
            self.consecutive_skips = 0
        else:
            self.skipped_steps += 1
            self.consecutive_skips += 1
            self.last_skip_reason = reason

        tokens = int(mask.sum().item())
        loss_tokens = max(acc["loss_tokens"], 1.0)
        seqs = max(int(mask.any(dim=-1).sum().item()), 1)
        ratio_max = float(torch.tensor(ratio_maxes).max())  # nan propagates
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
            "version": self.version,
            "skipped": reason is not None,
        }
        if self.ref_model is not None:
            out["kl"] = kl_value
        if reason is not None:
            out["skip_reason"] = reason
        out.update({f"mismatch/{k}": v for k, v in mismatch.items()})
        out["spans"] = [(Phase.train.value, start, time.time())]
        return out

    def _guarded_step(self, step_index: int) -> str | None:
        """optimizer.step(), undone (parameters and optimizer state) if any parameter turns non-finite.

        Holds a copy of the parameters and optimizer state for the duration of the step.
        """
        saved_params = [p.detach().clone() for p in self.params]
        saved_state = copy.deepcopy(self.optimizer.state_dict())
        self.optimizer.step()
        if all(bool(torch.isfinite(p).all()) for p in self.params):
            return None
        with torch.no_grad():
            for p, old in zip(self.params, saved_params):
                p.copy_(old)
        self.optimizer.load_state_dict(saved_state)
        return f"non-finite parameters after the update at step {step_index}"

    # -- weights and state ---------------------------------------------------------------------------------

    def get_weights(self, dtype: torch.dtype | str | None = None) -> dict[str, torch.Tensor]:
        """{name: CPU tensor} of model.state_dict() (HF checkpoint names), cast to dtype when given.

        Tensors are copies, never views of the live parameters. Raises NonFiniteWeightsError rather than
        return a non-finite tensor.
        """
        target = _as_dtype(dtype)
        weights = {}
        for name, tensor in self.model.state_dict().items():
            t = tensor.detach()
            if t.is_floating_point():
                if not bool(torch.isfinite(t).all()):
                    raise NonFiniteWeightsError(
                        f"{self.name}: parameter {name!r} is non-finite at version {self.version}; "
                        "refusing to export weights"
                    )
                if target is not None:
                    t = t.to(target)
            weights[name] = t.to("cpu", copy=True).contiguous()
        return weights

    def get_version(self) -> int:
        return self.version

    def health(self) -> dict[str, Any]:
        return {
            "ok": self.consecutive_skips < max(self.monitor.max_nonfinite_steps, 1),
            "name": self.name,
            "rank": self.rank,
            "device": str(self.device),
            "version": self.version,
            "steps": self.calls,
            "skipped_steps": self.skipped_steps,
            "consecutive_skips": self.consecutive_skips,
            "last_skip_reason": self.last_skip_reason,
        }

    def save(self, path: str) -> None:
        """An HF checkpoint folder (save_pretrained) plus learner_state.pt (version and optimizer state)."""
        os.makedirs(path, exist_ok=True)
        self.model.save_pretrained(path)
        state = {"version": self.version, "calls": self.calls, "optimizer": self.optimizer.state_dict()}
        torch.save(state, os.path.join(path, "learner_state.pt"))
