"""The DeepSpeed learner's setup that needs no deepspeed import: its DeepSpeed JSON config, the torch.distributed
environment of its rank, the names its checkpoint uses inside a checkpoint folder's ``learner/``, and the wrapper
of DeepSpeed's checkpoint engine that lets a checkpoint's files be written in the background."""

from __future__ import annotations

import os
from typing import Any

from rlgen.config import AlgoConfig
from rlgen.learners.background import to_host
from rlgen.learners.group import free_endpoint

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


# precision=fp16: dynamic loss scaling from 2^16, halved at an overflow (which skips the step) after a second in a
# row (hysteresis 2), doubled after 1,000 steps without one, never below 1
FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
        "min_loss_scale": 1}


def build_ds_config(algo: AlgoConfig, *, zero_stage: int, world_size: int = 1, bf16: bool = True,
                    precision: str = "bf16") -> dict[str, Any]:
    """The DeepSpeed JSON config for this learner. Pure: no deepspeed import. A step's micro-batches are as many as
    its tokens need (rlgen.microbatches), so the learner marks the last one as the accumulation boundary itself;
    DeepSpeed's batch geometry counts one micro-batch of one row a rank. precision="fp16": DeepSpeed's fp16 with
    fp32 master weights and dynamic loss scaling (FP16) in place of bf16."""
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
        **({"fp16": dict(FP16)} if precision == "fp16" else {"bf16": {"enabled": bool(bf16), "check_grad_overflow": True}}),
        "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # torch AdamW as a client optimizer: no op builds needed
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def dist_env(rank: int, world_size: int, master_addr: str | None, master_port: int | None) -> None:
    """torch.distributed settings for this rank of the learner group. Each rank is a Ray actor that sees only
    its own GPU, so LOCAL_RANK is 0. One rank alone picks a free local port."""
    if master_addr is None or master_port is None:
        if world_size > 1:
            raise ValueError("a learner group of several ranks needs master_addr and master_port from rank 0")

        master_addr, master_port = free_endpoint(local=True)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": str(master_addr), "MASTER_PORT": str(master_port)})


__all__ = ["CLIENT_KEY", "DS_TAG", "DeferredFiles", "build_ds_config", "dist_env"]
