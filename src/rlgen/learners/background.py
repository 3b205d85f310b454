"""Checkpoint files written by a thread of the learner's process, from copies of its tensors in host memory: the
learner trains on while the disk works. Each rank marks its part done (or failed, with why) with a small file the
driver waits for; one write runs at a time. torch is imported inside the functions that need it."""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

DONE, FAILED = "done", "failed"


def marker(checkpoint: str | Path, rank: int, kind: str) -> Path:
    """``<checkpoint>/learner/rank<r>.<kind>``: the file that says rank r's part is written (done) or not (failed)."""
    return Path(checkpoint) / "learner" / f"rank{rank}.{kind}"


PIN_SHARE = 0.25  # host copies of GPU tensors go to pinned memory while they take at most this share of free RAM


def to_host(obj: Any) -> Any:
    """A copy of a (nested dict, list or tuple of) tensors in host memory, detached; a tensor that appears twice
    (tied weights) is copied once, so the copy shares it the same way. Other values stay as they are.

    GPU tensors are copied into page-locked memory, all copies queued at once and waited for once, where they fit
    PIN_SHARE of the host's free memory: a pageable copy per tensor moved a 1.5B learner's 21 GiB of state at about
    1 GB/s. Freed page-locked blocks stay with torch's host allocator, so the next checkpoint reuses them."""
    import torch

    found: dict[int, Any] = {}
    _tensors(obj, found)
    on_gpu = [t for t in found.values() if t.is_cuda]
    pin = bool(on_gpu) and sum(t.nbytes for t in on_gpu) <= PIN_SHARE * free_host_bytes()
    memo = {key: _host_copy(t.detach(), pin) for key, t in found.items()}
    if pin:
        torch.cuda.synchronize()
    return _rebuild(obj, memo)


class HostCopies:
    """Host copies of tensors taken one at a time (a gather yields them so): into page-locked memory while they
    fit PIN_SHARE of the host's free memory, queued, and waited for once (``wait``) before they are read."""

    def __init__(self) -> None:
        self.room = PIN_SHARE * free_host_bytes()
        self.queued = False

    def add(self, t: Any) -> Any:
        size = t.nbytes
        pin = t.is_cuda and size <= self.room
        if pin:
            self.room -= size
            self.queued = True
        return _host_copy(t.detach(), pin)

    def wait(self) -> None:
        if self.queued:
            import torch

            torch.cuda.synchronize()
            self.queued = False


def tensor_sizes(obj: Any, dtype: Any = None) -> list[int]:
    """The bytes of each tensor (of ``dtype`` only, when given) in a (nested dict, list or tuple of) tensors, each
    counted once."""
    found: dict[int, Any] = {}
    _tensors(obj, found)
    return [t.nbytes for t in found.values() if dtype is None or t.dtype == dtype]


def reserve_pinned(sizes: list[int]) -> threading.Thread:
    """Page-lock host blocks of these sizes on a thread and hand them back to torch's host allocator, which keeps
    them: later host copies of tensors of these sizes (to_host, HostCopies) take them at once. Page-locking a
    1.5B learner's 21 GiB of state took 15-20 s, in which its process's CUDA calls waited. Stops at PIN_SHARE of
    the host's free memory, as the copies do."""

    def reserve() -> None:
        import torch

        room, blocks = PIN_SHARE * free_host_bytes(), []
        for size in sorted(sizes, reverse=True):
            if size <= room:
                blocks.append(torch.empty(size, dtype=torch.uint8, pin_memory=True))
                room -= size
        blocks.clear()  # back to the allocator's cache

    thread = threading.Thread(target=reserve, name="rlgen-reserve-pinned", daemon=True)
    thread.start()
    return thread


def free_host_bytes() -> int:
    """The host memory a process can take now: Linux's MemAvailable, which counts the page cache a checkpoint's
    own writes fill as free (MemFree does not), plus the page-locked blocks torch's host allocator keeps unused;
    0 where the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0
    return available + _cached_pinned_bytes()


def _cached_pinned_bytes() -> int:
    """Page-locked bytes torch's host allocator holds and no tensor uses (0 before CUDA is in use)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0
    try:
        stats = torch.cuda.host_memory_stats()
        return max(int(stats["allocated_bytes.current"]) - int(stats["active_bytes.current"]), 0)
    except (AttributeError, KeyError, RuntimeError):
        return 0


def _tensors(obj: Any, found: dict[int, Any]) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        found.setdefault(id(obj), obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensors(v, found)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensors(v, found)


def _host_copy(t: Any, pin: bool) -> Any:
    import torch

    if not (pin and t.is_cuda):
        return t.to("cpu", copy=True)
    out = torch.empty_like(t, device="cpu", pin_memory=True)
    out.copy_(t, non_blocking=True)  # waited for once, by to_host
    return out


def _rebuild(obj: Any, memo: dict[int, Any]) -> Any:
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, dict):
        return type(obj)((k, _rebuild(v, memo)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_rebuild(v, memo) for v in obj)
    return obj


class BackgroundWriter:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def run(self, jobs: Iterable[Callable[[], None]], checkpoint: str, rank: int, background: bool) -> None:
        """Run the jobs that write this rank's files: here (an error raises), or on a thread that marks the part
        done or failed (background). Waits for the previous background write first."""
        self.wait()
        jobs = list(jobs)
        if not background:
            for job in jobs:
                job()
            return
        self._thread = threading.Thread(target=self._write, args=(jobs, checkpoint, rank), daemon=True,
                                        name=f"rlgen-checkpoint-rank{rank}")
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background write; False when it is still going after timeout."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True

    @staticmethod
    def _write(jobs: list[Callable[[], None]], checkpoint: str, rank: int) -> None:
        t0 = time.time()
        try:
            for job in jobs:
                job()
        except BaseException as err:  # noqa: BLE001 - the driver reads why from the marker
            path = marker(checkpoint, rank, FAILED)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"error": f"{type(err).__name__}: {err}",
                                        "traceback": traceback.format_exc()}))
            return
        path = marker(checkpoint, rank, DONE)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"seconds": time.time() - t0}))


__all__ = ["DONE", "FAILED", "PIN_SHARE", "BackgroundWriter", "HostCopies", "free_host_bytes", "marker",
           "reserve_pinned", "tensor_sizes", "to_host"]
