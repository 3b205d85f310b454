"""Checkpoint files written by a thread of the learner's process, from copies of its tensors in host memory: the
learner trains on while the disk works. Each rank marks its part done (or failed, with why) with a small file the
driver waits for; one write runs at a time. torch is imported inside the functions that need it."""

from __future__ import annotations

import json
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


def to_host(obj: Any, _memo: dict[int, Any] | None = None) -> Any:
    """A copy of a (nested dict, list or tuple of) tensors in host memory, detached; a tensor that appears twice
    (tied weights) is copied once, so the copy shares it the same way. Other values stay as they are."""
    import torch

    memo = {} if _memo is None else _memo
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = obj.detach().to("cpu", copy=True)
        return memo[id(obj)]
    if isinstance(obj, dict):
        return type(obj)((k, to_host(v, memo)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v, memo) for v in obj)
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


__all__ = ["DONE", "FAILED", "BackgroundWriter", "marker", "to_host"]
