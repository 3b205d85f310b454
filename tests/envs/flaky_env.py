"""Environments for the multi-turn run tests, imported by module:Class in the engine actors (this folder is on
their PYTHONPATH)."""

from __future__ import annotations

import asyncio
import time

from rlgen.tasks.envs import Step


class FlakyEnv:
    """Two turns of chained addition, asynchronously; a prompt whose first operand is 1 raises in its first step,
    one whose first operand is 2 hangs past any small task.env_timeout_s, one whose first operand is 3 returns a
    dict instead of a Step."""

    def __init__(self, hang_s: float = 3.0):
        self.hang_s, self.total, self.first, self.turn = hang_s, 0, 0, 0

    def draw(self, rng, n):
        from rlgen.tasks.base import Prompt

        pairs = [(rng.randrange(10), rng.randrange(10)) for _ in range(n)]
        return [Prompt(f"{a}+{b}=", str(a + b)) for a, b in pairs]

    def reset(self, prompt, seed):
        self.total, self.first, self.turn = int(prompt.answer), int(prompt.text.split("+")[0]), 0

    async def step(self, action):
        self.turn += 1
        if self.first == 1:
            raise RuntimeError("the calculator is down")
        if self.first == 2:
            time.sleep(self.hang_s)
        if self.first == 3:
            return {"reward": 1}
        await asyncio.sleep(0.001)
        reward = 0.5 if action.strip() == str(self.total) else 0.0
        if self.turn >= 2:
            return Step(None, reward, True)
        self.total += 4
        return Step("+4=", reward, False)
