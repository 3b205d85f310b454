"""A GPU's start lock: a file lock per set of visible GPUs, which processes that start on the same GPU share.

vLLM sizes an engine's KV cache from the GPU's free memory while it profiles, so anything else that allocates
on that GPU meanwhile makes the cache smaller than it could be (a 0.5B engine measured 8.5 GiB instead of 14.0
beside a learner loading its weights). A measuring engine holds the lock alone (rlgen.engines.vllm.kvcache);
engines that start with a stored size, and learners while they load weights and build their optimizer, hold it
shared, so they run side by side with each other but never during a measurement. Imports nothing heavy."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)
POLL_S = 0.5


def visible_devices() -> str:
    """The GPUs this process sees, as CUDA_VISIBLE_DEVICES names them ("all" when it is unset)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() or "all"


def gpu_indices(devices: str) -> list[int] | None:
    """The NVML indices a CUDA_VISIBLE_DEVICES value names; None for "all" (unset) or names that are not
    indices (UUIDs)."""
    if devices == "all":
        return None
    try:
        return [int(x) for x in devices.split(",") if x.strip()]
    except ValueError:
        return None


def lock_path(devices: str) -> Path:
    return Path(tempfile.gettempdir()) / f"rlgen-gpu-start-{devices.replace(',', '-')}.lock"


def lock_paths(devices: str) -> list[Path]:
    """One start lock per GPU that ``devices`` names, in a fixed order (so two processes that take several never
    wait on each other crosswise): an engine over several GPUs holds each of them, a learner its one."""
    names = sorted({d.strip() for d in devices.split(",") if d.strip()}) or ["all"]
    return [lock_path(d) for d in names]


def acquire(f: IO, exclusive: bool, timeout_s: float) -> bool:
    """Take the lock on the open file f; False when timeout_s passed first."""
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    deadline = time.time() + timeout_s
    while True:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.time() > deadline:
                return False
            time.sleep(POLL_S)


@contextlib.contextmanager
def beside_engine_starts(who: str, timeout_s: float) -> Iterator[None]:
    """Hold this GPU's start lock shared: wait for an engine measuring its KV cache on it, at most timeout_s
    (then go on, with a warning: a stuck engine reports itself), and keep the next measurement out meanwhile."""
    with open(lock_path(visible_devices()), "a+") as f:
        held = acquire(f, exclusive=False, timeout_s=timeout_s)
        if not held:
            log.warning("%s waited %.0f s for an engine on GPU(s) %s to size its KV cache; going on", who, timeout_s,
                        visible_devices())
        try:
            yield
        finally:
            if held:
                fcntl.flock(f, fcntl.LOCK_UN)


__all__ = ["acquire", "beside_engine_starts", "gpu_indices", "lock_path", "lock_paths", "visible_devices"]
