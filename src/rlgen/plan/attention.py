"""learner.attention: which kernel the learners run over packed rows (rlgen.learners.attention), chosen once
by the plan from what is installed where the learners run, and shown by `rlgen plan`. No torch import: the
versions are read from the installed packages' metadata."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from rlgen.config import RunConfig, Setting, set_key
from rlgen.learners.registry import ATTENTION_BACKENDS, LearnerSpec

AUTO = "auto"
CUDA_ONLY = ("flash_attn", "torch_varlen")
VARLEN_SINCE = (2, 10)  # torch.nn.attention.varlen (FlashAttention over packed rows, with a backward)


def _torch_version() -> tuple[int, int]:
    try:
        major, minor = importlib.metadata.version("torch").split(".")[:2]
        return int(major), int(minor)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return (0, 0)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def present(backend: str) -> str | None:
    """None when backend is there to run, else why not."""
    if backend == "flash_attn" and not _installed("flash_attn"):
        return "flash-attn is not installed"
    if backend == "torch_varlen" and _torch_version() < VARLEN_SINCE:
        return f"torch {'.'.join(map(str, _torch_version()))} has no torch.nn.attention.varlen (2.10 and later)"
    return None


def resolve_attention(cfg: RunConfig, device: str, learner: LearnerSpec, p: list[str]) -> tuple[RunConfig, Setting]:
    """learner.attention: the config's (checked), or the fastest backend present: flash-attn, then torch's varlen
    FlashAttention on GPUs for a learner that trains in bf16, else causal SDPA over each row in turn."""
    chosen = cfg.learner.attention
    flash = device == "cuda" and learner.dtype != "float32"  # FlashAttention takes bf16 and fp16 only
    if chosen != AUTO:
        if chosen not in ATTENTION_BACKENDS:
            p.append(f"learner.attention={chosen} is not an attention backend; choose one of: auto, "
                     f"{', '.join(ATTENTION_BACKENDS)}.")
        elif chosen in CUDA_ONLY and device != "cuda":
            p.append(f"learner.attention={chosen} runs on CUDA GPUs only; use learner.attention=sdpa_segments "
                     "(or auto) on CPU.")
        elif chosen in CUDA_ONLY and not flash:
            p.append(f"learner.attention={chosen} takes bf16 and fp16 only, and {learner.label} trains in "
                     f"{learner.dtype}; use learner.attention=sdpa_segments (or auto).")
        elif why := present(chosen):
            p.append(f"learner.attention={chosen}: {why}; leave it auto for the fastest one present.")
        return cfg, Setting("learner.attention", chosen, "config")
    if not flash:
        where = "CPU" if device != "cuda" else f"{learner.label} trains in {learner.dtype}"
        backend, why = "sdpa_segments", f"derived: causal SDPA over each packed row in turn ({where})"
    else:
        backend = next(b for b in ATTENTION_BACKENDS if b not in CUDA_ONLY or present(b) is None)
        skipped = [f"{b}: {present(b)}" for b in ATTENTION_BACKENDS[: ATTENTION_BACKENDS.index(backend)]]
        why = f"derived: the fastest packed attention present ({'; '.join(skipped)})" if skipped else \
            "derived: the fastest packed attention present"
    return set_key(cfg, "learner.attention", backend), Setting("learner.attention", backend, why)


__all__ = ["resolve_attention"]
