"""How busy the GPUs are: nvidia-smi's utilization.gpu sampled while something runs (the bench's two sides, a
training run's loop), over the GPUs this process was given: those CUDA_VISIBLE_DEVICES names (by index or UUID,
as nvidia-smi -i takes them), or every GPU where it is unset."""

from __future__ import annotations

import subprocess
import threading

from rlgen.gpustart import visible_devices


def _only(devices: str) -> list[str]:
    return [] if devices == "all" else ["-i", devices]


def smi_rows(query: str, devices: str = "all") -> list[str]:
    """nvidia-smi's --query-gpu=query, a row per GPU of ``devices`` ("all", or as nvidia-smi -i takes them), as
    CSV without header or units; [] where nvidia-smi is missing or fails."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", *_only(devices)],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_count(devices: str = "all") -> int:
    """The GPUs nvidia-smi lists, of ``devices`` (0 where it is missing)."""
    return len(smi_rows("index", devices))


class BusySampler:
    """nvidia-smi's utilization.gpu (the share of time a kernel ran) every 100 ms, averaged over the windows
    between start() and stop() and over ``devices`` (default: the GPUs this process was given). Where nvidia-smi
    is missing, stop() returns None."""

    def __init__(self, period_ms: int = 100, devices: str | None = None):
        self._on = False
        self.devices = visible_devices() if devices is None else devices
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


__all__ = ["BusySampler", "gpu_count", "smi_rows"]
