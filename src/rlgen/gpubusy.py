"""How busy the GPUs are: nvidia-smi's utilization.gpu sampled while something runs (the bench's two sides, a
training run's loop), over the GPUs this process was given: those CUDA_VISIBLE_DEVICES names (by index or UUID,
as nvidia-smi -i takes them), or every GPU where it is unset."""

from __future__ import annotations

import os
import subprocess
import threading


def given_gpus() -> str:
    """The GPUs this process was given, as nvidia-smi -i takes them ("all" where CUDA_VISIBLE_DEVICES is unset)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() or "all"


def _only(devices: str) -> list[str]:
    return [] if devices == "all" else ["-i", devices]


def gpu_count(devices: str = "all") -> int:
    """The GPUs nvidia-smi lists, of ``devices`` (0 where it is missing)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader", *_only(devices)],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in out.stdout.splitlines() if line.strip()]) if out.returncode == 0 else 0


class BusySampler:
    """nvidia-smi's utilization.gpu (the share of time a kernel ran) every 100 ms, averaged over the windows
    between start() and stop() and over ``devices`` (default: the GPUs this process was given). Where nvidia-smi
    is missing, stop() returns None."""

    def __init__(self, period_ms: int = 100, devices: str | None = None):
        self._on = False
        self.devices = given_gpus() if devices is None else devices
        self.gpus = gpu_count(self.devices)
        self._samples: list[float] = []
        try:
            self._proc: subprocess.Popen | None = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms",
                 str(period_ms), *_only(self.devices)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None
            return
        threading.Thread(target=self._read, name="gpu-busy", daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            if not self._on:
                continue
            try:
                self._samples.append(float(line.split(",")[0]))
            except ValueError:
                continue

    def start(self) -> None:
        self._samples, self._on = [], True

    def stop(self) -> float | None:
        self._on = False
        got, self._samples = self._samples, []
        return round(sum(got) / len(got), 1) if got else None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)


__all__ = ["BusySampler", "given_gpus", "gpu_count"]
