"""An actor's start-up, timed: when its process started, when its constructor began and ended, the steps between
(imports, weights, engine start), and the parts of a step that a library's own log lines time (vLLM's weights,
compile, CUDA graphs). Actors return ``ActorClock.to_dict()`` in health(); the driver puts the numbers in the
run's start-up report. Imports nothing heavy."""

from __future__ import annotations

import os
import re
import time
from typing import Any


def process_start_time() -> float | None:
    """This process's start, as wall-clock seconds (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time after boot, in clock ticks
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class ActorClock:
    """Marks taken while an actor starts. ``step(name)`` closes the step under way (since the last mark) as
    `name`: the steps follow one another. ``add(name, seconds)`` records a part of a step measured by someone
    else (a vLLM log line), kept apart in ``parts``."""

    def __init__(self) -> None:
        self.process_start = process_start_time()
        self.init_begin = time.time()
        self.init_end: float | None = None
        self.steps: dict[str, float] = {}
        self.parts: dict[str, float] = {}
        self._last = self.init_begin

    def step(self, name: str) -> None:
        now = time.time()
        self.steps[name] = self.steps.get(name, 0.0) + now - self._last
        self._last = now

    def add(self, name: str, seconds: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + seconds

    def done(self) -> None:
        self.init_end = time.time()

    def to_dict(self) -> dict[str, Any]:
        return {"process_start": self.process_start, "init_begin": self.init_begin, "init_end": self.init_end,
                "steps": dict(self.steps), "parts": dict(self.parts)}


# vLLM's own start-up log lines (0.2x): what each one times, and the step it is reported as
VLLM_LINES = (
    (re.compile(r"Model loading took .*? and ([\d.]+) s"), "weights"),
    (re.compile(r"torch\.compile (?:takes|took) ([\d.]+) s in total"), "torch.compile"),
    (re.compile(r"Graph capturing finished in ([\d.]+) sec"), "CUDA graphs"),
    (re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"), "profile, KV cache, warm-up"),
)


def read_log_times(clock: ActorClock, text: str, lines: tuple = VLLM_LINES) -> None:
    """The seconds in start-up log lines of `text` (a process's captured output) into clock's parts."""
    for line in text.splitlines():
        for pattern, name in lines:
            m = pattern.search(line)
            if m:
                clock.add(name, float(m.group(1)))


__all__ = ["ActorClock", "process_start_time", "read_log_times"]
