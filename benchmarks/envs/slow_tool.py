"""A tool whose every call takes a random 50-500 ms, for benchmarks/tool_latency.py (imported by module:Class in
the engine actors, with this folder on their PYTHONPATH).

The episode: a prompt asks for a product; each policy turn is answered as a tool's result after the call's
latency, for ``turns`` policy turns in all; the last turn scores 1 when its last number is the product. The
latency is drawn from the episode's seed, so a run's calls take the same times on every run."""

from __future__ import annotations

import asyncio
import random

from rlgen.tasks.base import Prompt
from rlgen.tasks.envs import Step
from rlgen.tasks.rewards import last_number


class SlowToolEnv:
    def __init__(self, turns: int = 4, min_ms: float = 50.0, max_ms: float = 500.0, result_chars: int = 24):
        if turns < 1 or not 0 <= min_ms <= max_ms:
            raise ValueError("turns must be at least 1 and 0 <= min_ms <= max_ms")
        self.turns, self.min_ms, self.max_ms, self.result_chars = int(turns), min_ms, max_ms, int(result_chars)
        self.turn, self.answer, self.rng = 0, "", random.Random(0)
        self.waited_s = 0.0

    def draw(self, rng: random.Random, n: int) -> list[Prompt]:
        pairs = [(rng.randrange(100, 1000), rng.randrange(100, 1000)) for _ in range(n)]
        return [Prompt(f"Use the calculator to find {a}*{b}. ", str(a * b)) for a, b in pairs]

    def reset(self, prompt: Prompt, seed: int) -> None:
        self.turn, self.answer, self.rng = 0, prompt.answer, random.Random(seed)

    async def step(self, action: str) -> Step:
        self.turn += 1
        if self.turn >= self.turns:
            return Step(None, last_number(action, self.answer), True)
        latency = self.rng.uniform(self.min_ms, self.max_ms) / 1000.0
        await asyncio.sleep(latency)
        self.waited_s += latency
        result = f"result {self.rng.randrange(10**6)} after {latency * 1000:.0f} ms"
        return Step(result[: self.result_chars].ljust(self.result_chars), 0.0, False, role="tool")
