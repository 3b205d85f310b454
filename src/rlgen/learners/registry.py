"""Learner kinds: what the plan needs to know to choose one (where it runs, whether it trains with several ranks,
the package it needs) and how the runtime builds its actor. ``learner.kind=auto`` is resolved by the plan, once.
No torch import here: the plan reads these specs on machines without it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlgen.config import LearnerKind, RunConfig

# learner.attention's backends, fastest first (rlgen.learners.attention runs them; rlgen.plan.attention picks one)
ATTENTION_BACKENDS = ("flash_attn", "torch_varlen", "sdpa_segments")


@dataclass(frozen=True)
class LearnerSpec:
    kind: LearnerKind
    actor: str  # "package.module:Class"
    devices: tuple[str, ...]  # where it trains
    ranks: tuple[str, ...]  # the devices on which it trains with several ranks (one process each)
    label: str  # its name in sentences
    package: str | None = None  # the pip package it needs, checked before a run starts
    dtype: str = "bfloat16"  # what it trains in: FlashAttention kernels take bf16 and fp16 only
    starting: str = ""  # what one of its ranks does while it starts, said while the run waits for it
    # Extra constructor arguments: (the resolved config, the plan) -> kwargs. The plan is passed as a value;
    # this layer reads its fields and imports nothing of rlgen.plan.
    actor_kwargs: Callable[[RunConfig, Any], dict[str, Any]] = field(default=lambda cfg, plan: {})

    def actor_class(self) -> type:
        module, _, name = self.actor.partition(":")
        return getattr(importlib.import_module(module), name)


def _lora_kwargs(cfg: RunConfig, plan: Any = None) -> dict[str, Any]:
    """The resolved LoRA settings as the learners take them ({} without LoRA); the starting adapter
    (learner.lora.init) travels as a placed folder, like the model's."""
    lora = cfg.learner.lora
    if not lora.enabled:
        return {}
    return {"lora": {"rank": int(lora.rank), "alpha": float(lora.alpha), "dropout": float(lora.dropout),
                     "target_modules": tuple(lora.target_modules)}}


def _torch_kwargs(cfg: RunConfig, plan: Any = None) -> dict[str, Any]:
    """LoRA's settings, how long a collective of several ranks may wait (runtime.hang_timeout_s), the
    packed-attention backend the plan chose, the learner mesh's sequence degree, whether MLPs are tiled, the
    run's precision and whether it is deterministic."""
    return {**_lora_kwargs(cfg), "hang_timeout_s": float(cfg.runtime.hang_timeout_s),
            "attention": str(cfg.learner.attention), "sequence_parallel": int(cfg.learner.sequence_parallel or 1),
            "tiled_mlp": bool(cfg.learner.tiled_mlp), "precision": str(cfg.precision),
            "deterministic": bool(cfg.deterministic)}


def _deepspeed_kwargs(cfg: RunConfig, plan: Any) -> dict[str, Any]:
    return {
        **_torch_kwargs(cfg),
        "zero_stage": cfg.learner.zero_stage,
        "gradient_checkpointing": cfg.learner.gradient_checkpointing,
        "offload_checkpoints": bool(cfg.learner.offload_checkpoints),
        "sync_bucket_bytes": int(cfg.sync.bucket_mb * 2**20),
        "release_memory": bool(plan.colocated and not plan.engines_awake),  # engines that sleep wake into it
        # background checkpoints copy into page-locked host blocks, which the learner reserves as it starts
        "warm_checkpoint_copies": bool(cfg.checkpoint.background and cfg.checkpoint.every > 0),
        "env": plan.nccl_env,
    }


LEARNERS: dict[LearnerKind, LearnerSpec] = {
    LearnerKind.torch: LearnerSpec(LearnerKind.torch, "rlgen.learners.torch:TorchLearner", ("cpu", "cuda"),
                                   ranks=("cpu",), label="the torch learner", dtype="float32",
                                   actor_kwargs=_torch_kwargs,
                                   starting="a torch learner imports torch and transformers and builds the model and "
                                            "its optimizer"),
    LearnerKind.deepspeed: LearnerSpec(LearnerKind.deepspeed, "rlgen.learners.deepspeed:DeepSpeedLearner", ("cuda",),
                                       ranks=("cuda",), label="DeepSpeed", package="deepspeed",
                                       actor_kwargs=_deepspeed_kwargs,
                                       starting="a DeepSpeed learner imports, loads the model's weights, joins its "
                                                "process group and sets up ZeRO"),
}


def resolve_learner(kind: LearnerKind, device: str) -> LearnerSpec:
    """auto: DeepSpeed on GPUs, torch on CPU; any other kind as given."""
    if kind is LearnerKind.auto:
        kind = LearnerKind.deepspeed if device == "cuda" else LearnerKind.torch
    return LEARNERS[kind]


__all__ = ["ATTENTION_BACKENDS", "LEARNERS", "LearnerSpec", "resolve_learner"]
