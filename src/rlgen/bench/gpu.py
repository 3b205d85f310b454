"""GPU facts for the bench: nvidia-smi queries, versions, peak-memory sampling (busy time: rlgen.gpubusy)."""

from __future__ import annotations

import sys
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from rlgen.gpubusy import BusySampler  # noqa: F401 - the bench's busy-time sampler lives a layer below
from rlgen.gpubusy import smi_rows as _smi
from rlgen.gpustart import gpu_indices, visible_devices


def gpu_info() -> dict[str, Any]:
    rows = _smi("name,driver_version,memory.total")
    if not rows:
        return {}
    name, driver, total = (x.strip() for x in rows[0].split(","))
    return {"gpu": name, "driver": driver, "gpu_memory_gib": float(total) / 1024, "gpus": len(rows)}


def visible_gpus() -> list[int] | None:
    """The physical indices CUDA_VISIBLE_DEVICES names (None: all GPUs, or ids that are not indices)."""
    return gpu_indices(visible_devices())


def gpu_used_gib() -> float | None:
    """Memory in use (all processes) summed over this process's GPUs."""
    rows = _smi("memory.used")
    if not rows:
        return None
    ids = visible_gpus()
    picked = [rows[i] for i in ids if i < len(rows)] if ids is not None else rows
    return sum(float(r) for r in picked) / 1024


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for pkg in ("vllm", "torch", "transformers", "ray"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out


class MemorySampler:
    """Polls the GPU's used memory (all processes) on a thread; peak() is the highest reading since mark()."""

    def __init__(self, period_s: float = 0.5):
        self.period_s = period_s
        self._peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="gpu-mem", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            used = gpu_used_gib()
            if used is not None:
                self._peak = max(self._peak, used)
            self._stop.wait(self.period_s)

    def mark(self) -> None:
        self._peak = gpu_used_gib() or 0.0

    def peak(self) -> float:
        return self._peak

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def wait_gpu_free(baseline_gib: float, timeout_s: float = 90.0) -> float:
    """Wait until GPU memory falls back near baseline after an actor is killed; returns seconds waited."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        used = gpu_used_gib()
        if used is None or used < baseline_gib + 1.0:
            break
        time.sleep(1.0)
    return time.time() - t0


# -- the raw vLLM side ---------------------------------------------------------------------------------------
