"""How busy the GPUs are: nvidia-smi's utilization.gpu sampled while something runs (the bench's two sides, a
training run's loop)."""

from __future__ import annotations

import subprocess
import threading


def gpu_count() -> int:
    """The GPUs nvidia-smi lists (0 where it is missing)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in out.stdout.splitlines() if line.strip()]) if out.returncode == 0 else 0


class BusySampler:
    """nvidia-smi's utilization.gpu (the share of time a kernel ran) every 100 ms, averaged over the windows
    between start() and stop(): of the machine's first GPU, or with all_gpus of every GPU it shows. Where
    nvidia-smi is missing, stop() returns None."""

    def __init__(self, period_ms: int = 100, all_gpus: bool = False):
        self._on, self._all = False, all_gpus
        self.gpus = gpu_count()  # nvidia-smi writes a line a GPU per sample
        self._samples: list[float] = []
        try:
            self._proc: subprocess.Popen | None = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms",
                 str(period_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None
            return
        threading.Thread(target=self._read, name="gpu-busy", daemon=True).start()

    def _read(self) -> None:
        for n, line in enumerate(self._proc.stdout):
            if not self._on:
                continue
            try:
                self._samples.append(float(line.split(",")[0]))
            except ValueError:
                continue
            if not self._all and n % max(self.gpus, 1):  # a line a GPU a sample: keep the first GPU's
                self._samples.pop()

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


__all__ = ["BusySampler", "gpu_count"]
