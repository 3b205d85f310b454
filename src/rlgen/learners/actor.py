"""The learner actor: what the runtime calls on each learner rank through Ray, beside the weight transports
(rlgen.learners.sending). The torch and DeepSpeed learners both implement `LearnerActor`; what they share
that is not how gradients are taken lives here: the rank's identity and `StepCore`, the step counters a checkpoint
keeps, health, what a surviving rank reports, the KL in the reward, the teacher's scores, and the LoRA adapter's
exports."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from rlgen.adapter_folder import write_adapter
from rlgen.algo.registry import Algorithm
from rlgen.config import AlgoConfig, MonitorConfig
from rlgen.folder_bytes import pack
from rlgen.hostinfo import process_info
from rlgen.learners.background import BackgroundWriter
from rlgen.learners.collective import rng_digest
from rlgen.learners.lora import adapter_config, adapter_weights, save_merged
from rlgen.learners.step_core import StepCore
from rlgen.learners.teacher import TeacherScores
from rlgen.learners.token_batch import TokenBatch
from rlgen.types import RolloutBatch, StepResult

COUNTERS = ("version", "calls", "skipped_steps", "consecutive_skips", "last_skip_reason", "overflow_skips")


class NonFiniteWeightsError(RuntimeError):
    """A learner refuses to export weights (or a LoRA adapter) that are not all finite."""


def as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A torch dtype from its name ("bfloat16", "torch.bfloat16") or itself; None stays None."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


class LearnerActor:
    """One learner rank as a Ray actor: it trains on the batches the driver sends, exports its weights, and
    writes checkpoints and model folders. Each learner makes its own train_step, get_weights, save, save_model
    and save_checkpoint; the other calls are shared. A learner sets up its rank with `_init_actor` before it
    builds its model; it then holds ``core`` (its `StepCore`), ``peft`` (the PEFT model with LoRA, else None)
    and the step counters: version (applied updates), calls (train_step calls) and the skipped steps."""

    # Whether every rank holds the same parameters and optimizer state, so that a surviving rank can write a lost
    # rank's checkpoint files (rlgen.runtime.durability.learner_loss)
    replicas: ClassVar[bool]

    def _init_actor(self, algo: AlgoConfig, monitor: MonitorConfig, rank: int, name: str, device: torch.device,
                    algorithm: Algorithm | None = None) -> None:
        """What every learner holds before its model: settings, identity, its step core (no reference yet), no
        LoRA, step counters and the checkpoint writer."""
        self.algo, self.monitor, self.rank, self.name, self.device = algo, monitor, rank, name, device
        self.core = StepCore(algo, monitor, device, algorithm)
        self.peft: nn.Module | None = None  # the PEFT model with LoRA
        self._init_counters()
        self._writer = BackgroundWriter()

    def _init_counters(self) -> None:
        """Step bookkeeping: version (applied updates), train_step calls, skipped steps."""
        self.version = 0
        self.calls = 0
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self.overflow_skips = 0  # precision=fp16: steps the loss scale skipped
        self.last_skip_reason: str | None = None

    def _record_outcome(self, reason: str | None, overflow: bool = False) -> None:
        """Count the step: a new version when applied (reason None), a skip otherwise (overflow: an fp16 loss
        scale's, counted apart as well)."""
        if reason is None:
            self.version += 1
            self.consecutive_skips = 0
        else:
            self.skipped_steps += 1
            self.last_skip_reason = reason
            if overflow:  # the loss scale at work: not a non-finite step (health stays ok)
                self.overflow_skips += 1
            else:
                self.consecutive_skips += 1

    def _counters(self) -> dict[str, Any]:
        """Counters and RNG states a checkpoint keeps (plain values and CPU tensors)."""
        state: dict[str, Any] = {key: getattr(self, key) for key in COUNTERS}
        state["torch_rng"] = torch.get_rng_state()
        if torch.cuda.is_available() and self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def _restore_counters(self, state: dict[str, Any]) -> None:
        for key in COUNTERS:
            setattr(self, key, state.get(key, 0) if key == "overflow_skips" else state[key])  # older: none kept
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)

    # -- the actor's calls -----------------------------------------------------------------------------------

    def train_step(self, batch: TokenBatch | RolloutBatch) -> StepResult:
        """One optimizer step on the batch. Returns a StepResult: the version after the step, the skip reason
        (None: applied; overflow: an fp16 loss scale's skip), the step's spans [(phase, start, end), ...], with
        several ranks the RNG digest, the metrics (plain numbers: loss, pg_loss, grad_norm, entropy, the loss's
        own such as clip_frac and ratio_max, mismatch/* and mismatch/by_length/*, response_tokens, kl with a
        reference model in the loss) and how each reduces over the ranks (rlgen.metrics.reduce)."""
        raise NotImplementedError

    def get_weights(self, dtype: torch.dtype | str | None = None) -> dict[str, torch.Tensor]:
        """{name: CPU tensor} of every parameter (HF names), all finite, cast to dtype when given."""
        raise NotImplementedError

    def save(self, path: str) -> None:
        """An HF checkpoint folder plus learner_state.pt."""
        raise NotImplementedError

    def save_model(self, path: str) -> dict[str, Any]:
        """Called on every rank: the policy alone as a Hugging Face folder at path (rank 0 writes it)."""
        raise NotImplementedError

    def save_checkpoint(self, path: str, background: bool = False) -> dict[str, Any]:
        """Called on every rank: the policy (``model/``) and the learner's state (``learner/``) at path."""
        raise NotImplementedError

    def sequence_kl(self, batch: TokenBatch | RolloutBatch) -> list[float]:
        """Each sequence's summed KL between the engine's policy and the reference (algo.kl_penalty=reward: the
        driver subtracts kl_coef times it from the rewards before the advantages). [] without a reference."""
        return self.core.sequence_kl(batch)

    def teacher_logprobs(self, batch: TokenBatch | RolloutBatch) -> TeacherScores:
        """The teacher's logprobs of each response token of this rank's rows (on-policy distillation)."""
        return self.core.teacher_scores(batch)

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
            "overflow_skips": self.overflow_skips,
            "last_skip_reason": self.last_skip_reason,
            "startup": self.clock.to_dict() if hasattr(self, "clock") else None,
            **process_info(),
        }

    def whole_step(self) -> dict[str, Any]:
        """What a surviving rank holds: train_step calls, policy version, the digest of its RNG states, and whether
        the ranks are replicas."""
        return {"calls": self.calls, "version": self.version, "rng_digest": rng_digest(self.device),
                "replicas": type(self).replicas}

    # -- LoRA ------------------------------------------------------------------------------------------------

    def get_adapter(self, dtype: torch.dtype | str | None = None) -> dict[str, Any]:
        """The LoRA adapter at this version: {"tensors": {PEFT name: CPU tensor}, "config": adapter_config.json's
        contents, "version"}. Raises NonFiniteWeightsError rather than export a non-finite tensor."""
        if self.peft is None:
            raise RuntimeError(f"{self.name} trains without LoRA; it has no adapter to export.")
        tensors = adapter_weights(self.peft, as_dtype(dtype))
        bad = next((k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())), None)
        why = f"adapter tensor {bad!r} is non-finite" if bad else getattr(self, "sync_blocked", None)
        if why:
            raise NonFiniteWeightsError(f"{self.name}: {why} at version {self.version}; refusing to export the adapter")
        return {"tensors": tensors, "config": adapter_config(self.peft), "version": self.version}

    def save_merged(self, path: str) -> str:
        """The base with the adapters merged in, as a Hugging Face folder at path (final_model/merged)."""
        if self.peft is None:
            raise RuntimeError(f"{self.name} trains without LoRA; its model folder is already whole.")
        save_merged(self.peft, path)
        return path

    def _adapter_job(self, model_dir: str) -> Callable[[], None]:
        """A job writing the LoRA adapter folder (megabytes) at model_dir; the tensors are copied to host memory
        now, written when the job runs."""
        tensors, config = adapter_weights(self.peft), adapter_config(self.peft)
        return lambda: write_adapter(model_dir, tensors, config)

    # -- from a node that cannot write into the run directory -----------------------------------------------

    def save_model_packed(self) -> bytes:
        """save_model into a temporary folder on this node, returned packed (empty from ranks other than 0): for a
        learner on a node that cannot write into the driver's run directory."""
        with tempfile.TemporaryDirectory(prefix="rlgen-model-") as tmp:
            self.save_model(tmp)
            return pack(tmp) if self.rank == 0 else b""

    def save_checkpoint_packed(self) -> bytes:
        """save_checkpoint into a temporary folder on this node, returned packed: for a learner on a node that
        cannot write into the driver's run directory (see rlgen.runtime.durability.shared_folders)."""
        with tempfile.TemporaryDirectory(prefix="rlgen-ckpt-") as tmp:
            self.save_checkpoint(tmp)
            return pack(tmp)


__all__ = ["LearnerActor", "NonFiniteWeightsError", "as_dtype"]
