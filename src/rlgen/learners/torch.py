"""A single-process PyTorch learner: one GRPO optimizer step per rollout batch, with a non-finite guard."""

from __future__ import annotations

import copy
import math
import os
import tempfile
import time
from typing import Any

import torch
from torch import nn

from rlgen.adapter_folder import write_adapter
from rlgen.algo.registry import Algorithm
from rlgen.algo.registry import algorithm as find_algorithm
from rlgen.config import AlgoConfig, KLPenalty, LossAgg, MonitorConfig
from rlgen.hostinfo import process_info
from rlgen.learners.attention import use_packed_attention
from rlgen.learners.background import BackgroundWriter, to_host
from rlgen.learners.collective import join_group, leave_group, rng_digest, sum_over_ranks
from rlgen.learners.group import CollectiveFailed
from rlgen.learners.grpo_step import (
    Micro,
    StepSums,
    assemble_metrics,
    inverse,
    micro_loss,
    sequence_kl,
    unpack_batch,
    with_old_logprobs,
)
from rlgen.learners.lora import AdapterOff, adapter_config, adapter_weights, merged_weights, save_merged
from rlgen.learners.policy import adamw, frozen_model, load_policy, with_lora
from rlgen.packing import pack
from rlgen.phases import ActorClock
from rlgen.types import RolloutBatch


class NonFiniteWeightsError(RuntimeError):
    pass


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


class TorchLearner:
    """Loads an HF causal LM in float32 and trains it with the policy loss of its algorithm (`rlgen.algo`).

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
        ref_model_path: str | None = None,
        resume_from: str | None = None,
        algorithm: Algorithm | None = None,
        lora: dict[str, Any] | None = None,
        lora_init: str | None = None,
        world_size: int = 1,
        master_addr: str | None = None,
        master_port: int | None = None,
        hang_timeout_s: float = 300.0,
        attention: str = "sdpa_segments",
    ) -> None:
        """ref_model_path: the frozen reference for algo.kl_coef > 0 (default: model_path). resume_from: a
        checkpoint folder whose learner state (optimizer, counters, RNG) this learner continues from; its
        model_path is then the checkpoint's model folder (with LoRA: still the base, and the checkpoint's model
        folder holds the adapter). algorithm: the loss's algorithm (the driver passes the one it resolved; None:
        algo.kind's). lora: LoraSpec's fields: only adapters train, and the reference is the base with them off;
        lora_init: an adapter folder to start from. world_size > 1: data-parallel ranks (rank 0's master_addr and
        master_port), each training on its shard with the gradients summed over the group; every collective
        waits at most hang_timeout_s (rlgen.learners.collective). attention: the packed-attention backend
        (rlgen.learners.attention; the plan's learner.attention)."""
        self.clock = ActorClock()
        import transformers  # noqa: F401 - its import time is the clock's first phase

        if num_threads:
            torch.set_num_threads(num_threads)
        torch.manual_seed(seed)
        self._init_common(algo, monitor, rank, name, torch.device(device))
        self.loss_agg = LossAgg(algo.loss_agg)
        self.loss_fn = (algorithm or find_algorithm(algo.kind)).loss
        self.clock.step("import transformers")
        self.model = load_policy(model_path, torch.float32, self.device)
        use_packed_attention(self.model, attention)
        self.clock.step("weights")
        if lora:
            self.model = self.peft = with_lora(self.model, lora, resume_from, lora_init)
            self.clock.step("LoRA adapters")
        self.model.train()
        self.params, self.optimizer = adamw(self.model, algo)
        if algo.kl_coef > 0 and self.peft is not None:
            self.ref_model = AdapterOff(self.model, self.peft)
        elif algo.kl_coef > 0:
            self.ref_model = frozen_model(ref_model_path or self.model, torch.float32, self.device)
            use_packed_attention(self.ref_model, attention)
        if resume_from:
            state = load_learner_state(resume_from, self.rank)
            self.optimizer.load_state_dict(state["optimizer"])
            self._restore_counters(state)
        self.world_size, self.hang_timeout_s = int(world_size), float(hang_timeout_s)
        if self.world_size > 1:
            if master_addr is None or master_port is None:
                raise ValueError("a learner group of several ranks needs master_addr and master_port from rank 0")
            join_group(rank, self.world_size, master_addr, int(master_port), self.hang_timeout_s, self.device)
            self.clock.step("process group")
        self.clock.done()

    def _init_common(self, algo: AlgoConfig, monitor: MonitorConfig, rank: int, name: str,
                     device: torch.device) -> None:
        """What every learner holds before its model: settings, identity, no LoRA or reference yet, step counters
        and the checkpoint writer."""
        self.algo, self.monitor, self.rank, self.name, self.device = algo, monitor, rank, name, device
        self.ref_model: nn.Module | None = None
        self.peft: nn.Module | None = None  # the PEFT model with LoRA
        self._init_counters()
        self._writer = BackgroundWriter()

    def _init_counters(self) -> None:
        """Step bookkeeping: version (applied updates), train_step calls, skipped steps."""
        self.version = 0
        self.calls = 0
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self.last_skip_reason: str | None = None

    # -- training ------------------------------------------------------------------------------------------

    def _micro_backward(self, micro: Micro) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Forward and backward of one micro-batch with the loss left undivided (denominator 1). Returns its rows,
        the detached trainer logprobs [n, Lm] and `MicroLoss.sums()`."""
        out = micro_loss(self.model, self.ref_model if self._kl_in_loss() else None, micro, self.algo,
                         self.loss_agg, self.loss_fn)
        out.total.backward()
        return micro.rows, out.logp.detach(), out.sums()

    def _kl_in_loss(self) -> bool:
        return self.ref_model is not None and KLPenalty(self.algo.kl_penalty) is KLPenalty.loss

    def sequence_kl(self, batch: RolloutBatch) -> list[float]:
        """Each sequence's summed KL between the engine's policy and the reference (algo.kl_penalty=reward: the
        driver subtracts kl_coef times it from the rewards before the advantages). [] without a reference."""
        if self.ref_model is None:
            return []
        step = unpack_batch(batch, self.device, self.algo.micro_batch_tokens)
        return [float(v) for v in sequence_kl(self.ref_model, step, self.algo).cpu()]

    # Every rank holds the same parameters and optimizer state (data parallel, gradients summed before the step),
    # so a surviving rank can write a lost rank's checkpoint files (save_checkpoint_for).
    replicas = True

    def train_step(self, batch: RolloutBatch) -> dict[str, Any]:
        """One optimizer step. See `Learner.train_step` for the returned keys; with several ranks also rng_digest
        (rlgen.learners.collective.rng_digest after the step).

        A step whose all-reduce did not complete applied no update: the step counter and RNG states go back to
        the last whole step's, and CollectiveFailed is raised."""
        calls, rng = self.calls, torch.get_rng_state()
        try:
            out = self._train_step(batch)
        except CollectiveFailed:
            self.calls = calls
            torch.set_rng_state(rng)
            self.optimizer.zero_grad(set_to_none=True)
            raise
        if self.world_size > 1:
            out["rng_digest"] = rng_digest(self.device)
        return out

    def _train_step(self, batch: RolloutBatch) -> dict[str, Any]:
        """One optimizer step.

        Packed micro-batches (the driver's, or of at most algo.micro_batch_tokens tokens) each backpropagate their
        loss summed over tokens/sequences (denominator 1); once all are done the gradients are divided by the
        whole batch's denominator (after sequence masking), so any split gives the whole-batch loss and gradient.
        Parameters do not change before optimizer.step(), so the mismatch metrics, gathered over the
        micro-batches, are those of the policy before the update.
        """
        start = time.time()
        step_index = self.calls
        self.calls += 1
        algo = self.algo
        step = with_old_logprobs(self.model, unpack_batch(batch, self.device, algo.micro_batch_tokens), algo)

        self.optimizer.zero_grad(set_to_none=True)
        sums = StepSums(step)
        for micro in step.micros():
            sums.add(*self._micro_backward(micro))

        denom = sums.totals["denom"]
        if self.world_size > 1:
            denom = self._sum_gradients(step_index, denom)
        if denom > 0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(denom)
        pg_loss, kl_value, loss = sums.losses(inverse(denom), algo)
        max_norm = algo.grad_clip if algo.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm).item())

        if not math.isfinite(grad_norm):
            reason = f"non-finite gradient norm ({grad_norm}) at step {step_index}"
        elif not math.isfinite(loss):
            reason = f"non-finite loss ({loss}) at step {step_index}"
        else:
            reason = self._guarded_step(step_index)
        self.optimizer.zero_grad(set_to_none=True)
        self._record_outcome(reason)
        return assemble_metrics(
            step,
            sums,
            loss=loss,
            pg_loss=pg_loss,
            kl_value=kl_value if self._kl_in_loss() else None,
            grad_norm=grad_norm,
            version=self.version,
            reason=reason,
            delta_threshold=self.monitor.delta_threshold,
            start=start,
        )

    def _sum_gradients(self, step_index: int, denom: float) -> float:
        """The gradient all-reduce: every rank's gradients (undivided) and loss denominator summed over the group.
        Returns the whole batch's denominator; raises CollectiveFailed when the all-reduce does not complete."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return sum_over_ranks([p.grad for p in self.params], denom, rank=self.rank,
                              operation=f"the gradient all-reduce of step {step_index}",
                              timeout_s=self.hang_timeout_s)

    def whole_step(self) -> dict[str, Any]:
        """What a surviving rank holds: train_step calls, policy version, the digest of its RNG states, and whether
        the ranks are replicas."""
        return {"calls": self.calls, "version": self.version, "rng_digest": rng_digest(self.device),
                "replicas": type(self).replicas}

    def save_checkpoint_for(self, path: str, ranks: list[int]) -> dict[str, Any]:
        """save_checkpoint written as each of ranks: this rank's optimizer state, counters and RNG states under
        each rank's name, and the model folder when rank 0 is among them. Valid only where the ranks are
        replicas with equal RNG states (the caller checks whole_step's digests)."""
        t0 = time.time()
        jobs = []
        if 0 in ranks:
            if self.rank != 0:  # transformers writes a model folder only on torch.distributed rank 0, and this
                leave_group()   # group lost a rank anyway: the run stops once this checkpoint is written
            jobs.append(self._model_folder_job(os.path.join(path, "model"), False))
        state = {**self._counters(), "optimizer": self.optimizer.state_dict()}
        jobs.extend((lambda r=r: save_learner_state(path, r, state)) for r in ranks)
        for job in jobs:
            job()
        return {"actor": self.name, "ranks": list(ranks), "version": self.version, "seconds": time.time() - t0}

    def _counters(self) -> dict[str, Any]:
        """Counters and RNG states a checkpoint keeps (plain values and CPU tensors)."""
        state: dict[str, Any] = {
            "version": self.version, "calls": self.calls, "skipped_steps": self.skipped_steps,
            "consecutive_skips": self.consecutive_skips, "last_skip_reason": self.last_skip_reason,
            "torch_rng": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def _restore_counters(self, state: dict[str, Any]) -> None:
        for key in ("version", "calls", "skipped_steps", "consecutive_skips", "last_skip_reason"):
            setattr(self, key, state[key])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)

    def _record_outcome(self, reason: str | None) -> None:
        """Count the step: a new version when applied (reason None), a skip otherwise."""
        if reason is None:
            self.version += 1
            self.consecutive_skips = 0
        else:
            self.skipped_steps += 1
            self.consecutive_skips += 1
            self.last_skip_reason = reason

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
        state = merged_weights(self.peft) if self.peft is not None else self.model.state_dict().items()
        for name, tensor in state:
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

    def get_adapter(self, dtype: torch.dtype | str | None = None) -> dict[str, Any]:
        """The LoRA adapter at this version: {"tensors": {PEFT name: CPU tensor}, "config": adapter_config.json's
        contents, "version"}. Raises NonFiniteWeightsError rather than export a non-finite tensor."""
        if self.peft is None:
            raise RuntimeError(f"{self.name} trains without LoRA; it has no adapter to export.")
        tensors = adapter_weights(self.peft, _as_dtype(dtype))
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
            "startup": self.clock.to_dict() if hasattr(self, "clock") else None,
            **process_info(),
        }

    def save(self, path: str) -> None:
        """An HF checkpoint folder (save_pretrained) plus learner_state.pt (version and optimizer state)."""
        os.makedirs(path, exist_ok=True)
        self.model.save_pretrained(path)
        state = {"version": self.version, "calls": self.calls, "optimizer": self.optimizer.state_dict()}
        torch.save(state, os.path.join(path, "learner_state.pt"))

    def save_checkpoint(self, path: str, background: bool = False) -> dict[str, Any]:
        """Into a checkpoint folder: the policy as an HF folder (``model/``) and this rank's optimizer state,
        counters and RNG states (``learner/``). ``resume_from=path`` continues from exactly here. background:
        the state is copied to host memory and written by a thread while the learner trains on; the rank's
        part is marked done (or failed) in ``learner/`` (rlgen.learners.background)."""
        t0 = time.time()
        jobs = []
        if self.rank == 0:
            jobs.append(self._model_folder_job(os.path.join(path, "model"), background))
        state = {**self._counters(), "optimizer": to_host(self.optimizer.state_dict()) if background
                 else self.optimizer.state_dict()}
        jobs.append(lambda: save_learner_state(path, self.rank, state))
        self._writer.run(jobs, path, self.rank, background)
        return {"actor": self.name, "version": self.version, "seconds": time.time() - t0, "background": background}

    def _model_folder_job(self, model_dir: str, background: bool) -> Any:
        """A job writing the policy's folder: the adapter folder with LoRA (megabytes), else the HF model folder.
        background: the tensors are copied to host memory now, written later."""
        if self.peft is not None:
            tensors, config = adapter_weights(self.peft), adapter_config(self.peft)
            return lambda: write_adapter(model_dir, tensors, config)
        weights = to_host(self.model.state_dict()) if background else None
        return lambda: self.model.save_pretrained(model_dir, state_dict=weights)

    def save_model(self, path: str) -> dict[str, Any]:
        """The policy alone as a Hugging Face folder at path (the adapter folder with LoRA), written by rank 0; no
        optimizer state. What a run keeps at its end where the disk has no room for a whole checkpoint. Called on
        every rank, as gathering the weights may be a collective."""
        t0 = time.time()
        if self.rank == 0:
            self._model_folder_job(path, False)()
        return {"actor": self.name, "version": self.version, "seconds": time.time() - t0}

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


def learner_state_path(checkpoint: str, rank: int) -> str:
    return os.path.join(checkpoint, "learner", f"rank{rank}.pt")


def save_learner_state(checkpoint: str, rank: int, state: dict[str, Any]) -> None:
    path = learner_state_path(checkpoint, rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(state, path)


def load_learner_state(checkpoint: str, rank: int) -> dict[str, Any]:
    path = learner_state_path(checkpoint, rank)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: the checkpoint has no learner state for rank {rank}.")
    return torch.load(path, map_location="cpu", weights_only=True)
