"""A DeepSpeed ZeRO learner (stage 2 or 3) on one GPU per rank: bf16, gradient checkpointing, micro-batches.

Same protocol, metrics keys and GRPO loss as ``TorchLearner``; what differs is what ZeRO forces. The loss is
divided by the whole batch's denominator before backward, micro-batches accumulate with DeepSpeed's own
boundary (a no-grad forward comes first where the denominator or algo.old_logprobs=trainer needs the trainer's
logprobs), and a non-finite step is skipped through DeepSpeed's overflow check (parameters that turn
non-finite after a step cannot be rolled back, so their export is refused). The optimizer is torch's AdamW,
handed to ZeRO as a client optimizer; deepspeed is imported only when a learner is built. docs/weight_sync.md
("DeepSpeed learner") has the details; measurements are in docs/benchmarks.md.
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
from rlgen.algo.registry import algorithm as find_algorithm
from rlgen.config import AlgoConfig, LossAgg, MonitorConfig
from rlgen.gpustart import beside_engine_starts
from rlgen.learners.attention import use_packed_attention
from rlgen.learners.background import HostCopies, reserve_pinned, tensor_sizes, to_host
from rlgen.learners.group import free_endpoint
from rlgen.learners.grpo_step import (
    Micro,
    StepSums,
    assemble_metrics,
    batch_denominator,
    inverse,
    micro_loss,
    unpack_batch,
    with_old_logprobs,
)
from rlgen.learners.lora import AdapterOff
from rlgen.learners.policy import adamw, frozen_model, load_policy, with_lora
from rlgen.learners.sending import PolicySender
from rlgen.learners.torch import NonFiniteWeightsError, TorchLearner
from rlgen.phases import ActorClock
from rlgen.sync.layout import DEFAULT_BUCKET_BYTES, plan_buckets
from rlgen.sync.waits import run_with_timeout
from rlgen.types import Phase, RolloutBatch

log = logging.getLogger(__name__)
MEASURE_WAIT_S = 600.0  # at most this long for an engine on the learner's GPU to size its KV cache, then go on
DS_TAG = "zero"  # the tag of DeepSpeed's checkpoint inside a checkpoint's learner/ folder
# rlgen's counters and RNG states ride in DeepSpeed's client state under one key of their own: DeepSpeed keeps a
# "skipped_steps" of its own there and drops it from what load_checkpoint hands back
CLIENT_KEY = "rlgen"


class DeferredFiles:
    """DeepSpeed's checkpoint engine, whose saves can be deferred: while ``defer`` is on, each file DeepSpeed
    saves is kept as a copy in host memory, and ``write_deferred`` writes them later (from a background thread)
    through the engine it wraps. Everything else (loading, commits) goes to that engine."""

    def __init__(self, inner: Any):
        self.inner, self.defer, self.deferred = inner, False, []

    def save(self, state_dict: Any, path: str) -> None:
        if self.defer:
            self.deferred.append((to_host(state_dict), path))
        else:
            self.inner.save(state_dict, path)

    def write_deferred(self) -> None:
        files, self.deferred = self.deferred, []
        for state_dict, path in files:
            self.inner.save(state_dict, path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def build_ds_config(algo: AlgoConfig, *, zero_stage: int, world_size: int = 1, bf16: bool = True) -> dict[str, Any]:
    """The DeepSpeed JSON config for this learner. Pure: no deepspeed import. A step's micro-batches are as many as
    its tokens need (rlgen.microbatches), so the learner marks the last one as the accumulation boundary itself;
    DeepSpeed's batch geometry counts one micro-batch of one row a rank."""
    if zero_stage not in (2, 3):
        raise ValueError(f"learner.zero_stage={zero_stage}: this learner runs ZeRO stage 2 or 3.")
    zero: dict[str, Any] = {"stage": zero_stage, "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_bucket_size": int(5e8)}
    if zero_stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(5e7), stage3_param_persistence_threshold=int(1e5),
                    stage3_gather_16bit_weights_on_model_save=True)
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": float(algo.grad_clip) if algo.grad_clip > 0 else 0.0,
        "bf16": {"enabled": bool(bf16), "check_grad_overflow": True},
        "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # torch AdamW as a client optimizer: no op builds needed
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _dist_env(rank: int, world_size: int, master_addr: str | None, master_port: int | None) -> None:
    """torch.distributed settings for this rank of the learner group. Each rank is a Ray actor that sees only
    its own GPU, so LOCAL_RANK is 0. One rank alone picks a free local port."""
    if master_addr is None or master_port is None:
        if world_size > 1:
            raise ValueError("a learner group of several ranks needs master_addr and master_port from rank 0")

        master_addr, master_port = free_endpoint(local=True)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": str(master_addr), "MASTER_PORT": str(master_port)})


class DeepSpeedLearner(PolicySender, TorchLearner):
    # ZeRO partitions the optimizer state (and with stage 3 the parameters) over the ranks: a surviving rank
    # cannot write a lost rank's files, so a lost rank stops the run at the last complete checkpoint.
    replicas = False

    """ZeRO-2/3 learner. Constructor arguments are plain values so the class can be wrapped in ray.remote.

    zero_stage: 2 or 3. gradient_checkpointing: recompute activations in backward (HF's non-reentrant
    checkpointing). sync_bucket_bytes: ZeRO-3 gathers at most this many bytes of parameters at once when
    exporting weights. attention: the packed-attention backend (rlgen.learners.attention).

    Several ranks (world_size > 1, one Ray actor per GPU, rank 0's master_addr/master_port) train as one
    data-parallel learner: each gets its shard of the batch, the loss denominator is the whole batch's (one
    all-reduce), and DeepSpeed averages the gradients, so the update is the one-rank update of the whole batch.
    release_memory: return cached GPU memory after each step (colocated engines need it to wake up). env:
    variables set before NCCL starts (NCCL_*).
    """

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
        resume_from: str | None = None,
        algorithm: Algorithm | None = None,
        lora: dict[str, Any] | None = None,
        lora_init: str | None = None,
        hang_timeout_s: float = 300.0,
        warm_checkpoint_copies: bool = False,
        attention: str = "torch_varlen",
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
            torch.manual_seed(seed)
            torch.cuda.set_device(0)  # Ray narrows CUDA_VISIBLE_DEVICES to this actor's GPU
            self._init_state(algo, monitor, rank, name, torch.device("cuda", 0), zero_stage, sync_bucket_bytes,
                             world_size, release_memory, algorithm)
            self.ds_config = build_ds_config(algo, zero_stage=self.zero_stage, world_size=world_size)

            module = load_policy(model_path, torch.bfloat16, self.device)
            use_packed_attention(module, attention)
            if gradient_checkpointing:
                module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                module.config.use_cache = False
            if lora:  # only the adapters train; the base with them off is the KL reference
                module = self.peft = with_lora(module, lora, resume_from, lora_init)
            elif algo.kl_coef > 0:  # a full bf16 copy; fine for the sizes rlgen targets on one GPU
                self.ref_model = frozen_model(ref_model_path or model_path, torch.bfloat16, self.device)
                use_packed_attention(self.ref_model, attention)
            self.clock.step("weights")
            _, optimizer = adamw(module, algo)
            _dist_env(rank, world_size, master_addr, master_port)
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # a timed-out collective raises on its rank
            deepspeed.init_distributed(dist_backend="nccl", timeout=timedelta(seconds=float(hang_timeout_s)))
            self.engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=self.ds_config)
            self._ckpt_files.inner = self.engine.checkpoint_engine  # background checkpoints hand their files over
            self.engine.checkpoint_engine = self._ckpt_files
            self.engine.train()
            self.model = self.engine  # the forward (rlgen.learners.packed) calls self.model(...)
            self.module = self.engine.module
            if self.peft is not None and algo.kl_coef > 0:
                self.ref_model = AdapterOff(self.engine, self.peft)
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
        self._init_common(algo, monitor, rank, name, device)
        self.loss_agg = LossAgg(algo.loss_agg)
        self.loss_fn = (algorithm or find_algorithm(algo.kind)).loss
        self.zero_stage = int(zero_stage)
        self.sync_bucket_bytes = int(sync_bucket_bytes)
        self.world_size = int(world_size)
        self.release_memory = bool(release_memory)
        self._ckpt_files = DeferredFiles(None)  # wraps DeepSpeed's checkpoint engine once there is one
        self.sync_blocked = None

    # -- training --------------------------------------------------------------------------------------
    def _micro_step(self, micro: Micro, scale: float, poison: bool):
        """Forward and backward of one micro-batch; the loss is pre-divided by the batch denominator (scale =
        1/denominator). poison, or a non-finite loss, makes the loss NaN so that DeepSpeed's overflow check
        skips the step. Returns its rows, the detached trainer logprobs [n, Lm] and `MicroLoss.sums()`."""
        out = micro_loss(self.model, self.ref_model if self._kl_in_loss() else None, micro, self.algo,
                         self.loss_agg, self.loss_fn)
        total = out.total
        if poison or not math.isfinite(out.pg + out.kl + out.ent):
            total = total * float("nan")
        self.engine.backward(total * scale, scale_wrt_gas=False)
        return micro.rows, out.logp.detach(), out.sums()

    def train_step(self, batch: RolloutBatch) -> dict[str, Any]:
        """One optimizer step; the returned keys are TorchLearner.train_step's. Every rank runs as many
        micro-batches as the others (the driver's assignment), since each meets the others in ZeRO's reduce."""
        start = time.time()
        step_index = self.calls
        self.calls += 1
        algo = self.algo
        # algo.old_logprobs=trainer: every row's logprobs before the update, one no-grad forward per micro-batch
        step = with_old_logprobs(self.model, unpack_batch(batch, self.device, algo.micro_batch_tokens), algo)
        # The whole batch's denominator over every rank's shard; DeepSpeed then averages the ranks' gradients,
        # so each rank scales by world_size / denominator.
        denom = self._sum_over_ranks(batch_denominator(self.model, step, algo, self.loss_agg))
        scale = self.world_size * inverse(denom)

        sums = StepSums(step)
        micros = step.micros()
        for i, micro in enumerate(micros):
            last = i == len(micros) - 1
            self.engine.set_gradient_accumulation_boundary(last)
            poison = last and not math.isfinite(sums.losses(scale, algo)[2])
            sums.add(*self._micro_step(micro, scale, poison))
        pg_loss, kl_value, loss = sums.losses(inverse(denom), algo)  # this shard's share of the loss

        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        grad_norm = float(norm) if norm is not None else float("nan")
        if not math.isfinite(loss):
            reason = f"non-finite loss ({loss}) at step {step_index}"
        elif not self.engine.was_step_applied():
            reason = f"non-finite gradient norm ({grad_norm}) at step {step_index}"
        elif not self._local_weights_finite():
            reason = f"non-finite parameters after the update at step {step_index} (not rolled back under ZeRO)"
            self.sync_blocked = reason
        else:
            reason = None
        self._record_outcome(reason)
        if self.release_memory:  # colocated: hand the allocator's cache back before the engines wake up
            torch.cuda.empty_cache()
        return assemble_metrics(
            step, sums, loss=loss, pg_loss=pg_loss, kl_value=kl_value if self._kl_in_loss() else None,
            grad_norm=grad_norm, version=self.version, reason=reason, delta_threshold=self.monitor.delta_threshold,
            start=start,
        )

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
                self._model_folder_job(path, False)()
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
                jobs.append(self._model_folder_job(os.path.join(path, "model"), background))
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
