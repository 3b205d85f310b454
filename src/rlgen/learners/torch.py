"""A single-process PyTorch learner: one GRPO optimizer step per rollout batch, with a non-finite guard."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import time
from typing import Any

import torch

from rlgen.algo.registry import Algorithm
from rlgen.config import AlgoConfig, MonitorConfig
from rlgen.learners.actor import LearnerActor, NonFiniteWeightsError, as_dtype
from rlgen.learners.attention import use_packed_attention
from rlgen.learners.background import to_host
from rlgen.learners.collective import join_group, leave_group, rng_digest, sum_over_ranks
from rlgen.learners.group import CollectiveFailed
from rlgen.learners.grpo_step import inverse
from rlgen.learners.lora import AdapterOff, merged_weights
from rlgen.learners.policy import adamw, deterministic_algorithms, frozen_reference, load_policy, with_lora
from rlgen.learners.tiling import tile_mlps
from rlgen.learners.token_batch import TokenBatch
from rlgen.learners.ulysses import join_sequence_groups, learner_mesh
from rlgen.phases import ActorClock
from rlgen.types import RolloutBatch, StepResult


class TorchLearner(LearnerActor):
    """Loads an HF causal LM in float32 and trains it with the policy loss of its algorithm (`rlgen.algo`),
    stepping torch's AdamW on CPU or one device; its `StepCore` (``core``) does the batch's loss and backward.

    Constructor arguments are plain values so the class can be wrapped in `ray.remote`.
    num_threads: torch intra-op threads (1 by default: on a small CPU machine the engine runs beside it);
    None leaves torch's setting alone.
    """

    # Every rank holds the same parameters and optimizer state (data parallel, gradients summed before the step),
    # so a surviving rank can write a lost rank's checkpoint files (save_checkpoint_for).
    replicas = True

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
        teacher_path: str | None = None,
        resume_from: str | None = None,
        algorithm: Algorithm | None = None,
        lora: dict[str, Any] | None = None,
        lora_init: str | None = None,
        world_size: int = 1,
        master_addr: str | None = None,
        master_port: int | None = None,
        hang_timeout_s: float = 300.0,
        attention: str = "sdpa_segments",
        sequence_parallel: int = 1,
        tiled_mlp: bool = False,
        precision: str = "bf16",
        deterministic: bool = False,
    ) -> None:
        """ref_model_path: the frozen reference for algo.kl_coef > 0 (default: model_path). teacher_path:
        on-policy distillation's frozen teacher (algo.teacher's folder), scored by teacher_logprobs. resume_from: a
        checkpoint folder whose learner state (optimizer, counters, RNG) this learner continues from; its
        model_path is then the checkpoint's model folder (with LoRA: still the base, and the checkpoint's model
        folder holds the adapter). algorithm: the loss's algorithm (the driver passes the one it resolved; None:
        algo.kind's). lora: LoraSpec's fields: only adapters train, and the reference is the base with them off;
        lora_init: an adapter folder to start from. world_size > 1: data-parallel ranks (rank 0's master_addr and
        master_port), each training on its shard with the gradients summed over the group; every collective
        waits at most hang_timeout_s (rlgen.learners.collective). attention: the packed-attention backend
        (rlgen.learners.attention; the plan's learner.attention). sequence_parallel: the learner mesh's sequence
        degree (rlgen.mesh): groups of that many neighbouring ranks train the same rows, each forwarding a slice of
        every micro-batch's tokens (rlgen.learners.ulysses). tiled_mlp: each layer's MLP a tile of tokens at a time
        (rlgen.learners.tiling). precision: "fp16" computes the forwards in float16 under autocast over the float32
        weights, with torch's GradScaler for dynamic loss scaling (a step whose gradients overflow is skipped and
        counted, StepResult.overflow); else float32 throughout. deterministic: torch's deterministic algorithms
        (rlgen.learners.policy.deterministic_algorithms)."""
        self.clock = ActorClock()
        import transformers  # noqa: F401 - its import time is the clock's first phase

        if num_threads:
            torch.set_num_threads(num_threads)
        if deterministic:
            deterministic_algorithms()
        torch.manual_seed(seed)
        self._init_actor(algo, monitor, rank, name, torch.device(device), algorithm)
        self.clock.step("import transformers")
        self.model = load_policy(model_path, torch.float32, self.device)
        use_packed_attention(self.model, attention)
        if tiled_mlp:
            tile_mlps(self.model)
        self.clock.step("weights")
        if lora:
            self.model = self.peft = with_lora(self.model, lora, resume_from, lora_init)
            self.clock.step("LoRA adapters")
        self.model.train()
        self.params, self.optimizer = adamw(self.model, algo)
        self.scaler = torch.amp.GradScaler(self.device.type) if precision == "fp16" else None
        if algo.kl_coef > 0 and self.peft is not None:
            self.core.ref_model = AdapterOff(self.model, self.peft)
        elif algo.kl_coef > 0:
            self.core.ref_model = frozen_reference(ref_model_path or self.model, torch.float32, self.device, attention,
                                                   tiled_mlp)
        if teacher_path:
            self.core.teacher = frozen_reference(teacher_path, torch.float32, self.device, attention, tiled_mlp)
        if resume_from:
            state = load_learner_state(resume_from, self.rank)
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None and "scaler" in state:
                self.scaler.load_state_dict(state["scaler"])
            self._restore_counters(state)
        self.world_size, self.hang_timeout_s = int(world_size), float(hang_timeout_s)
        self.mesh = learner_mesh(self.world_size, sequence_parallel)
        if self.world_size > 1:
            if master_addr is None or master_port is None:
                raise ValueError("a learner group of several ranks needs master_addr and master_port from rank 0")
            join_group(rank, self.world_size, master_addr, int(master_port), self.hang_timeout_s, self.device)
            self.core.sequence = join_sequence_groups(self.mesh.sequence_groups(), rank, self.hang_timeout_s)
            self.clock.step("process group")
        self.clock.done()

    # -- training ------------------------------------------------------------------------------------------

    def train_step(self, batch: TokenBatch | RolloutBatch) -> StepResult:
        """One optimizer step (`Learner.train_step`); with several ranks its result holds the digest of this rank's
        RNG states after the step (rlgen.learners.collective.rng_digest).

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
            out = dataclasses.replace(out, rng_digest=rng_digest(self.device))
        return out

    def _train_step(self, batch: TokenBatch | RolloutBatch) -> StepResult:
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
        algo, core = self.algo, self.core
        with self._compute():
            step = core.prepare(self.model, batch)
            self.optimizer.zero_grad(set_to_none=True)
            scale = None
            if self.scaler is not None:  # fp16: each micro-batch's loss over the whole batch's denominator
                denom = self._whole_denominator(step_index, core.denominator(self.model, step))  # before backward,
                scale = inverse(denom)  # so the scaled gradients are the loss's, not a sum of many tokens'
            sums = core.accumulate(self.model, step, self._micro_backward, scale=scale)

        if scale is None:
            denom = sums.totals["denom"]
            if self.world_size > 1:
                denom = self._sum_gradients(step_index, denom)
            if denom > 0:
                for p in self.params:
                    if p.grad is not None:
                        p.grad.div_(denom)
        else:
            if self.world_size > 1:
                self._sum_gradients(step_index, 0.0)
            self.scaler.unscale_(self.optimizer)  # the summed gradients, alike on every rank, back to their size
        losses = core.losses(sums, denom)
        loss = losses[2]
        max_norm = algo.grad_clip if algo.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm).item())

        overflow = self.scaler is not None and not math.isfinite(grad_norm) and math.isfinite(loss)
        if overflow:
            reason = (f"fp16 overflow at step {step_index}: the gradients overflowed at loss scale "
                      f"{self.scaler.get_scale():g}, so the update was skipped and the scale lowered")
        elif not math.isfinite(grad_norm):
            reason = f"non-finite gradient norm ({grad_norm}) at step {step_index}"
        elif not math.isfinite(loss):
            reason = f"non-finite loss ({loss}) at step {step_index}"
        else:
            reason = self._guarded_step(step_index)
        if self.scaler is not None:  # after every unscale_: lowers the scale after an overflow, else may raise it
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self._record_outcome(reason, overflow)
        return core.result(step, sums, losses, grad_norm=grad_norm, version=self.version, reason=reason,
                           start=start, overflow=overflow)

    def _compute(self) -> Any:
        """The forwards' precision: fp16 autocast over the float32 master weights (precision=fp16), else as
        loaded."""
        if self.scaler is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.float16)

    def _micro_backward(self, loss: torch.Tensor) -> None:
        """The backward of one micro-batch's loss (undivided): its gradients add to the parameters' (times the
        loss scale under precision=fp16, outside autocast)."""
        if self.scaler is None:
            loss.backward()
            return
        with torch.autocast(self.device.type, enabled=False):
            self.scaler.scale(loss).backward()

    def _whole_denominator(self, step_index: int, own: float) -> float:
        """The whole batch's loss denominator from this rank's share (a sequence group's once, by its lead)."""
        if self.world_size == 1:
            return own
        return sum_over_ranks([torch.zeros(1, device=self.device)], own if self.mesh.leads(self.rank) else 0.0,
                              rank=self.rank, operation=f"the loss denominator of step {step_index}",
                              timeout_s=self.hang_timeout_s)

    def _sum_gradients(self, step_index: int, denom: float) -> float:
        """The gradient all-reduce: every rank's gradients (undivided) and loss denominator summed over the group
        (a sequence group's denominator once, by its lead: its ranks share rows). Returns the whole batch's
        denominator; raises CollectiveFailed when the all-reduce does not complete."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        share = denom if self.mesh.leads(self.rank) else 0.0
        return sum_over_ranks([p.grad for p in self.params], share, rank=self.rank,
                              operation=f"the gradient all-reduce of step {step_index}",
                              timeout_s=self.hang_timeout_s)

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
        state = {**self._counters(), **self._scale_state(), "optimizer": self.optimizer.state_dict()}
        jobs.extend((lambda r=r: save_learner_state(path, r, state)) for r in ranks)
        for job in jobs:
            job()
        return {"actor": self.name, "ranks": list(ranks), "version": self.version, "seconds": time.time() - t0}

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
        target = as_dtype(dtype)
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
        state = {**self._counters(), **self._scale_state(), "optimizer": to_host(self.optimizer.state_dict())
                 if background else self.optimizer.state_dict()}
        jobs.append(lambda: save_learner_state(path, self.rank, state))
        self._writer.run(jobs, path, self.rank, background)
        return {"actor": self.name, "version": self.version, "seconds": time.time() - t0, "background": background}

    def _scale_state(self) -> dict[str, Any]:
        """The loss scaler's state where there is one (precision=fp16), for a checkpoint's learner state."""
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def _model_folder_job(self, model_dir: str, background: bool) -> Any:
        """A job writing the policy's folder: the adapter folder with LoRA (megabytes), else the HF model folder.
        background: the tensors are copied to host memory now, written later."""
        if self.peft is not None:
            return self._adapter_job(model_dir)
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


__all__ = ["NonFiniteWeightsError", "TorchLearner", "learner_state_path", "load_learner_state",
           "save_learner_state"]
