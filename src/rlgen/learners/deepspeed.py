"""A DeepSpeed ZeRO learner (stage 2 or 3) on one GPU per rank: bf16 (or fp16, precision), gradient checkpointing,
micro-batches.

Same actor calls (rlgen.learners.actor), metrics keys and loss (rlgen.learners.step_core) as the torch learner;
what differs is what ZeRO forces. The loss is divided by the whole batch's denominator before backward,
micro-batches accumulate with DeepSpeed's own boundary (a no-grad forward comes first where the denominator or
algo.old_logprobs=trainer needs the trainer's logprobs), and a non-finite step is skipped through DeepSpeed's
overflow check (parameters that turn non-finite after a step cannot be rolled back, so their export is refused).
The optimizer is torch's AdamW, handed to ZeRO as a client optimizer; deepspeed is imported only when a learner
is built. docs/weight_sync.md ("DeepSpeed learner") has the details; measurements are in docs/benchmarks.md.
"""

from __future__ import annotations

import logging
import math
import os
import time
from datetime import timedelta
from typing import Any

import torch

from rlgen.algo.registry import Algorithm
from rlgen.config import AlgoConfig, MonitorConfig
from rlgen.gpustart import beside_engine_starts
from rlgen.learners.actor import LearnerActor, NonFiniteWeightsError
from rlgen.learners.attention import use_packed_attention
from rlgen.learners.background import HostCopies, reserve_pinned, tensor_sizes
from rlgen.learners.ds_setup import CLIENT_KEY, DS_TAG, DeferredFiles, build_ds_config, dist_env
from rlgen.learners.grpo_step import inverse
from rlgen.learners.lora import AdapterOff
from rlgen.learners.offload import offload_checkpoints as offload
from rlgen.learners.policy import adamw, deterministic_algorithms, frozen_reference, load_policy, with_lora
from rlgen.learners.sending import PolicySender
from rlgen.learners.tiling import tile_mlps
from rlgen.learners.token_batch import TokenBatch
from rlgen.learners.ulysses import join_sequence_groups, learner_mesh
from rlgen.phases import ActorClock
from rlgen.sync.layout import DEFAULT_BUCKET_BYTES, plan_buckets
from rlgen.sync.waits import run_with_timeout
from rlgen.types import Phase, RolloutBatch, StepResult

log = logging.getLogger(__name__)
MEASURE_WAIT_S = 600.0  # at most this long for an engine on the learner's GPU to size its KV cache, then go on


class DeepSpeedLearner(PolicySender, LearnerActor):
    """ZeRO-2/3 learner: a DeepSpeed engine around the policy takes its backward and optimizer step, and its
    `StepCore` (``core``) the batch's loss. Constructor arguments are plain values so the class can be wrapped
    in ray.remote.

    zero_stage: 2 or 3. gradient_checkpointing: recompute activations in backward (HF's non-reentrant
    checkpointing). sync_bucket_bytes: ZeRO-3 gathers at most this many bytes of parameters at once when
    exporting weights. attention: the packed-attention backend (rlgen.learners.attention).

    Several ranks (world_size > 1, one Ray actor per GPU, rank 0's master_addr/master_port) train as one
    data-parallel learner: each gets its shard of the batch, the loss denominator is the whole batch's (one
    all-reduce), and DeepSpeed averages the gradients, so the update is the one-rank update of the whole batch.
    release_memory: return cached GPU memory after each step (colocated engines need it to wake up). env:
    variables set before NCCL starts (NCCL_*). sequence_parallel: the learner mesh's sequence degree
    (rlgen.mesh): groups of that many neighbouring ranks train the same rows, each forwarding a slice of every
    micro-batch's tokens (rlgen.learners.ulysses); DeepSpeed still averages over every rank, and each group's
    denominator counts once. tiled_mlp: each layer's MLP a tile of tokens at a time (rlgen.learners.tiling).
    offload_checkpoints: the gradient checkpoints in host memory (rlgen.learners.offload).
    """

    # ZeRO partitions the optimizer state (and with stage 3 the parameters) over the ranks: a surviving rank
    # cannot write a lost rank's files, so a lost rank stops the run at the last complete checkpoint.
    replicas = False

    def __init__(
        self,
        model_path: str,
        algo: AlgoConfig,
        monitor: MonitorConfig,
        seed: int = 0,
        device: str = "cuda",
        rank: int = 0,
        name: str = "learner0",
        zero_stage: int = 2,
        gradient_checkpointing: bool = True,
        sync_bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        world_size: int = 1,
        master_addr: str | None = None,
        master_port: int | None = None,
        release_memory: bool = False,
        env: dict[str, str] | None = None,
        ref_model_path: str | None = None,
        teacher_path: str | None = None,
        resume_from: str | None = None,
        algorithm: Algorithm | None = None,
        lora: dict[str, Any] | None = None,
        lora_init: str | None = None,
        hang_timeout_s: float = 300.0,
        warm_checkpoint_copies: bool = False,
        attention: str = "torch_varlen",
        sequence_parallel: int = 1,
        tiled_mlp: bool = False,
        offload_checkpoints: bool = False,
        precision: str = "bf16",
        deterministic: bool = False,
    ) -> None:
        self.clock = ActorClock()
        if not torch.cuda.is_available():
            raise RuntimeError("DeepSpeedLearner needs a CUDA GPU; use the torch learner (TorchLearner) on CPU.")
        try:
            import deepspeed
        except ImportError as err:
            raise RuntimeError(f"DeepSpeedLearner needs deepspeed: pip install 'rlgen[gpu]' ({err}).") from err
        import transformers  # noqa: F401 - timed with deepspeed, as the clock's first phase

        self.clock.step("import deepspeed")

        # CUDA's context, the weights and the optimizer go on the GPU between engines' KV measurements, which
        # would count them as the engine's own use (rlgen.gpustart)
        with beside_engine_starts(name, MEASURE_WAIT_S):
            self.clock.step("wait for engines sizing their KV cache")
            os.environ.update({k: str(v) for k, v in (env or {}).items()})
            if deterministic:  # before the first CUDA work: cuBLAS reads its workspace setting once
                deterministic_algorithms()
            torch.manual_seed(seed)
            torch.cuda.set_device(0)  # Ray narrows CUDA_VISIBLE_DEVICES to this actor's GPU
            self._init_state(algo, monitor, rank, name, torch.device("cuda", 0), zero_stage, sync_bucket_bytes,
                             world_size, release_memory, algorithm)
            self.ds_config = build_ds_config(algo, zero_stage=self.zero_stage, world_size=world_size,
                                             precision=precision)
            self.fp16 = precision == "fp16"
            half = torch.float16 if self.fp16 else torch.bfloat16
            module = load_policy(model_path, half, self.device)
            use_packed_attention(module, attention)
            if tiled_mlp:
                tile_mlps(module)
            if gradient_checkpointing:
                module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                if offload_checkpoints:
                    offload(module)
                module.config.use_cache = False
            if lora:  # only the adapters train; the base with them off is the KL reference
                module = self.peft = with_lora(module, lora, resume_from, lora_init)
            elif algo.kl_coef > 0:  # a full bf16 copy; fine for the sizes rlgen targets on one GPU
                self.core.ref_model = frozen_reference(ref_model_path or model_path, half, self.device,
                                                       attention, tiled_mlp)
            if teacher_path:  # on-policy distillation's frozen teacher, in the learner's half precision
                self.core.teacher = frozen_reference(teacher_path, half, self.device, attention, tiled_mlp)
            self.clock.step("weights")
            _, optimizer = adamw(module, algo)
            dist_env(rank, world_size, master_addr, master_port)
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # a timed-out collective raises on its rank
            deepspeed.init_distributed(dist_backend="nccl", timeout=timedelta(seconds=float(hang_timeout_s)))
            self.mesh = learner_mesh(self.world_size, sequence_parallel)
            self.core.sequence = join_sequence_groups(self.mesh.sequence_groups(), rank, hang_timeout_s) \
                if self.world_size > 1 else None
            self.engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=self.ds_config)
            self._ckpt_files.inner = self.engine.checkpoint_engine  # background checkpoints hand their files over
            self.engine.checkpoint_engine = self._ckpt_files
            self.engine.train()
            self.model = self.engine  # the forward (rlgen.learners.packed) calls self.model(...)
            self.module = self.engine.module
            if self.peft is not None and algo.kl_coef > 0:
                self.core.ref_model = AdapterOff(self.engine, self.peft)
            self.clock.step("DeepSpeed engine")
        if resume_from:
            self._resume(resume_from)
            self.clock.step("resume state")
        if warm_checkpoint_copies:
            self._warm_checkpoint_copies()
        self.clock.done()

    def _init_state(self, algo, monitor, rank, name, device, zero_stage, sync_bucket_bytes, world_size=1,
                    release_memory=False, algorithm: Algorithm | None = None) -> None:
        """Bookkeeping shared by every construction path (tests build the learner around a stand-in engine)."""
        self._init_actor(algo, monitor, rank, name, device, algorithm)
        self.zero_stage = int(zero_stage)
        self.sync_bucket_bytes = int(sync_bucket_bytes)
        self.world_size = int(world_size)
        self.mesh = learner_mesh(self.world_size, 1)
        self.release_memory = bool(release_memory)
        self._ckpt_files = DeferredFiles(None)  # wraps DeepSpeed's checkpoint engine once there is one
        self.sync_blocked = None
        self.fp16 = False  # precision=fp16: DeepSpeed's loss scale (its skips are overflows, not non-finite steps)

    # -- training --------------------------------------------------------------------------------------
    def train_step(self, batch: TokenBatch | RolloutBatch) -> StepResult:
        """One optimizer step; the returned keys are the torch learner's. Every rank runs as many micro-batches
        as the others (the driver's assignment), since each meets the others in ZeRO's reduce."""
        start = time.time()
        step_index = self.calls
        self.calls += 1
        core = self.core
        # algo.old_logprobs=trainer: every row's logprobs before the update, one no-grad forward per micro-batch
        step = core.prepare(self.model, batch)
        # The whole batch's denominator over every rank's shard; DeepSpeed then averages the ranks' gradients,
        # so each rank scales by world_size / denominator. A non-finite loss is made NaN before the engine's
        # backward (poison), so that DeepSpeed's overflow check skips the step.
        own = core.denominator(self.model, step)
        denom = self._sum_over_ranks(own if self.mesh.leads(self.rank) else 0.0)  # a sequence group's once
        scale = self.world_size * inverse(denom)
        sums = core.accumulate(self.model, step, self._micro_backward, scale=scale,
                               boundary=self.engine.set_gradient_accumulation_boundary, poison=True)
        losses = core.losses(sums, denom)  # this shard's share of the loss
        loss = losses[2]

        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        grad_norm = float(norm) if norm is not None else float("nan")
        overflow = False
        if not math.isfinite(loss):
            reason = f"non-finite loss ({loss}) at step {step_index}"
        elif not self.engine.was_step_applied() and self.fp16:  # DeepSpeed's loss scale skipped it and lowered
            overflow = True
            reason = (f"fp16 overflow at step {step_index}: the gradients overflowed the loss scale, so the update "
                      f"was skipped (the scale is now {self._loss_scale()})")
        elif not self.engine.was_step_applied():
            reason = f"non-finite gradient norm ({grad_norm}) at step {step_index}"
        elif not self._local_weights_finite():
            reason = f"non-finite parameters after the update at step {step_index} (not rolled back under ZeRO)"
            self.sync_blocked = reason
        else:
            reason = None
        self._record_outcome(reason, overflow)
        if self.release_memory:  # colocated: hand the allocator's cache back before the engines wake up
            torch.cuda.empty_cache()
        return core.result(step, sums, losses, grad_norm=grad_norm, version=self.version, reason=reason,
                           start=start, overflow=overflow)

    def _loss_scale(self) -> str:
        """DeepSpeed's current fp16 loss scale, as its optimizer wrapper names it."""
        opt = self.engine.optimizer
        scale = getattr(opt, "cur_scale", None) or getattr(getattr(opt, "loss_scaler", None), "cur_scale", None)
        return f"{scale:g}" if isinstance(scale, (int, float)) else "lower"

    def _micro_backward(self, loss: torch.Tensor) -> None:
        """The engine's backward of one micro-batch's loss, already divided (scale_wrt_gas off: the learner
        marks the accumulation boundary itself)."""
        self.engine.backward(loss, scale_wrt_gas=False)

    def _local_weights_finite(self) -> bool:
        """Every rank's parameter storage (ZeRO-3: each rank's partitions) is all finite (read back once)."""
        stored = (getattr(p, "ds_tensor", None) if self.zero_stage == 3 else p for p in self.module.parameters())
        flags = [torch.isfinite(t).all() for t in stored if t is not None and t.numel()]
        finite = bool(torch.stack(flags).all()) if flags else True
        return self._sum_over_ranks(0.0 if finite else 1.0) == 0.0

    def _warm_checkpoint_copies(self) -> None:
        """Page-lock, on a thread, the host blocks a background checkpoint copies this rank's state into: the
        policy (rank 0), DeepSpeed's module state, its fp32 master partitions and, before the first step makes
        them, AdamW's two moments of the same shapes. Page-locking about 21 GiB for a 1.5B rank took 15-20 s, in
        which the learner's own CUDA calls wait. Done as the learner starts, it falls in the time the learner
        waits for the first batch instead of the first checkpoint's (or, after the first step, a step's)."""
        try:
            optimizer = self.engine.optimizer
            state = [self.engine.module_state_dict(), optimizer.state_dict()]
        except Exception as err:  # noqa: BLE001 - only an optimisation: the first checkpoint pins its own blocks
            log.warning("%s: host blocks for checkpoints not reserved ahead (%s)", self.name, err)
            return
        sizes = tensor_sizes(state)
        if not getattr(getattr(optimizer, "optimizer", None), "state", None):  # AdamW's moments come at step 1
            sizes += 2 * tensor_sizes(state[1], torch.float32)
        if self.peft is None and self._gathers_weights():  # as save_checkpoint: LoRA writes only its adapters
            sizes += [math.prod(self.full_shape(p)) * p.element_size() for _, p in self.named_weights()]
        reserve_pinned(sizes)

    def _gathers_weights(self) -> bool:
        """Whether this rank takes a host copy of the whole policy at a checkpoint: rank 0, which writes it, and
        every rank under ZeRO-3, whose gathers are collectives."""
        return self.rank == 0 or self.zero_stage == 3

    def _sum_over_ranks(self, value: float) -> float:
        """value summed over the learner group (one all-reduce; the value itself with one rank)."""
        if self.world_size == 1:
            return float(value)
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item())

    # -- weights ---------------------------------------------------------------------------------------
    def named_weights(self) -> list[tuple[str, Any]]:
        if self.peft is not None:
            return super().named_weights()  # the base's names, adapters merged in
        return list(self.module.named_parameters())

    def iter_weights(self, dtype: str | None = None, bucket_bytes: int | None = None):
        """(name, full tensor [shape]) for every parameter. ZeRO-3 gathers a bucket of parameters at a time
        and yields copies, so the bucket can be released as soon as the consumer moves on."""
        if self.zero_stage < 3:
            yield from super().iter_weights(dtype)
            return
        import deepspeed

        target = getattr(torch, dtype) if dtype else None
        named = self.named_weights()
        sizes = [math.prod(self.full_shape(p)) * p.element_size() for _, p in named]
        for bucket in plan_buckets(sizes, bucket_bytes or self.sync_bucket_bytes):
            params = [named[i][1] for i in bucket]
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                for i in bucket:
                    name, p = named[i]
                    yield name, p.detach().to(dtype=target or p.dtype, copy=True)

    def drain_weights(self, version: int, dtype: str, bucket_bytes: int, timeout_s: float) -> dict:
        """A rank other than 0 under ZeRO-3: take part in the bucketed gathers while rank 0 sends the weights
        (each gather is a collective over the group); the tensors are dropped here."""

        self._check_send(version)
        t0 = time.time()

        def drain() -> int:
            torch.cuda.set_device(self.device)
            return sum(1 for _ in self.iter_weights(dtype, bucket_bytes))

        n = run_with_timeout(drain, timeout_s, f"{self.name}: ZeRO-3 gather for version {version}")
        return {"actor": self.name, "version": int(version), "tensors": n, "spans": [(Phase.sync.value, t0, time.time())]}

    def get_weights(self, dtype: torch.dtype | str | None = None) -> dict[str, torch.Tensor]:
        """{name: CPU tensor} of every parameter (HF names, bf16 unless dtype says otherwise), all finite."""
        if self.sync_blocked:
            raise NonFiniteWeightsError(f"{self.name}: {self.sync_blocked}; refusing to export weights")
        name = str(dtype).removeprefix("torch.") if dtype is not None else None
        out, finite, copies = {}, [], HostCopies()
        for key, t in self.iter_weights(name):
            if t.is_floating_point():
                finite.append((key, torch.isfinite(t).all()))  # read once, after every copy is queued
            out[key] = copies.add(t.contiguous())
        copies.wait()
        if finite and not bool(torch.stack([f for _, f in finite]).all()):
            key = next(k for k, f in finite if not bool(f))
            raise NonFiniteWeightsError(f"{self.name}: parameter {key!r} is non-finite at version {self.version}")
        return out

    def save(self, path: str) -> None:
        """An HF checkpoint folder (full bf16 weights gathered from ZeRO) plus learner_state.pt (version)."""
        os.makedirs(path, exist_ok=True)
        weights = self.get_weights()
        if self.rank == 0:
            self.module.save_pretrained(path, state_dict=weights)
            torch.save({"version": self.version, "calls": self.calls}, os.path.join(path, "learner_state.pt"))

    def _lora_checkpoint_args(self, key: str, value: bool) -> dict[str, bool]:
        """With LoRA, DeepSpeed's checkpoint leaves the frozen base out (it is the model folder the run started
        from), and loading it expects only the adapters."""
        return {key: value} if self.peft is not None else {}

    def _resume(self, checkpoint: str) -> None:
        """DeepSpeed's own checkpoint: fp32 master weights, optimizer partitions of every rank, scheduler; then
        rlgen's counters and RNG states from its client state."""
        _, client = self.engine.load_checkpoint(os.path.join(checkpoint, "learner"), tag=DS_TAG,
                                                load_optimizer_states=True, load_lr_scheduler_states=True,
                                                **self._lora_checkpoint_args("load_module_strict", False))
        self._restore_counters(client[CLIENT_KEY])

    def save_model(self, path: str) -> dict[str, Any]:
        """The policy alone as a Hugging Face folder at path (bf16, gathered; rank 0 writes it; the adapter folder
        with LoRA), without DeepSpeed's checkpoint. Called on every rank: the gather is a collective under
        ZeRO-3."""
        t0 = time.time()
        if self.peft is not None:
            if self.rank == 0:
                self._adapter_job(path)()
        elif self._gathers_weights():
            weights = self.get_weights()
            if self.rank == 0:
                self.module.save_pretrained(path, state_dict=weights)
        return {"actor": self.name, "version": self.version, "seconds": time.time() - t0}

    def save_checkpoint(self, path: str, background: bool = False) -> dict[str, Any]:
        """Every rank: the policy as an HF folder (``model/``, bf16, gathered; rank 0 writes it) and DeepSpeed's
        checkpoint of the engine (``learner/``: fp32 master weights, optimizer partitions, counters, RNG).
        background: DeepSpeed's files are handed to its checkpoint engine as host copies and written, with the
        HF folder, by a thread while the learner trains on (rlgen.learners.background)."""
        t0 = time.time()
        torch.cuda.empty_cache()  # NCCL allocates outside torch's cache at its first collective (DeepSpeed's barrier)
        jobs = []
        if self.peft is not None:  # the adapter folder (megabytes); the frozen base stays out of the checkpoint
            if self.rank == 0:
                jobs.append(self._adapter_job(os.path.join(path, "model")))
        elif self._gathers_weights():
            weights = self.get_weights()  # host tensors; a collective under ZeRO-3
            if self.rank == 0:
                model_dir = os.path.join(path, "model")
                jobs.append(lambda: self.module.save_pretrained(model_dir, state_dict=weights))
        files = self._ckpt_files
        files.defer = background
        try:
            self.engine.save_checkpoint(os.path.join(path, "learner"), tag=DS_TAG,
                                        client_state={CLIENT_KEY: self._counters()}, save_latest=False,
                                        **self._lora_checkpoint_args("exclude_frozen_parameters", True))
        finally:
            files.defer = False
        jobs.append(files.write_deferred)
        self._writer.run(jobs, path, self.rank, background)
        if self.release_memory:
            torch.cuda.empty_cache()
        return {"actor": self.name, "version": self.version, "seconds": time.time() - t0, "background": background}


__all__ = ["DeepSpeedLearner", "build_ds_config"]
