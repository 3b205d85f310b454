"""Environments for the episode tests (tests/unit/test_episodes.py), by module:Class (``episode_envs:EchoEnv``):
each episode's environment runs in a process of its own, which imports this module; it imports nothing heavy."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from rlgen.tasks.envs import Step


class EchoEnv:
    """Answers each turn with "+<turn>=" and scores 1 per turn whose action holds the digit 7; done after `turns`.
    ``fail`` at step ``at``: "raise", "hang" (never answers), "malformed" (a dict), "exit" (its process dies);
    "hang_reset": reset never answers. ``pids``: a folder where each episode's process leaves a file named by its
    pid."""

    def __init__(self, turns: int = 3, fail: str = "", at: int = 2, pids: str = ""):
        self.turns, self.fail, self.at, self.pids, self.n = turns, fail, at, pids, 0

    def reset(self, prompt, seed):
        self.n = 0
        if self.pids:
            open(os.path.join(self.pids, str(os.getpid())), "w").close()
        if self.fail == "hang_reset":
            threading.Event().wait()

    def step(self, action):
        self.n += 1
        if self.fail and self.n == self.at:
            if self.fail == "raise":
                raise RuntimeError("the tool broke")
            if self.fail == "hang":
                threading.Event().wait()
            if self.fail == "malformed":
                return {"observation": "x"}
            if self.fail == "exit":
                os._exit(3)
        return Step(f"+{self.n}=", 1.0 if "7" in action else 0.0, self.n >= self.turns)


class AsyncEnv(EchoEnv):
    async def step(self, action):
        await asyncio.sleep(0.01)
        return EchoEnv.step(self, action)


class SlowEvenEnv(EchoEnv):
    """EchoEnv whose even samples' steps take 0.5 s (a slow tool); odd samples answer at once."""

    def reset(self, prompt, seed):
        super().reset(prompt, seed)
        self.slow = seed % 2 == 0

    def step(self, action):
        if self.slow:
            time.sleep(0.5)
        return super().step(action)


class SleepyEnv(EchoEnv):
    """Each step takes 0.2 s."""

    def step(self, action):
        time.sleep(0.2)
        return super().step(action)


class LateEnv(EchoEnv):
    """Its second step takes 0.6 s, then answers as if nothing happened."""

    def step(self, action):
        if self.n == 1:
            time.sleep(0.6)
        return super().step(action)


class Unbuildable:
    """Its constructor raises (a licence server that does not answer, say)."""

    def __init__(self):
        raise RuntimeError("no licence server")

    def reset(self, prompt, seed):
        pass

    def step(self, action):
        return Step(None, 0.0, True)


class NoDraw(EchoEnv):
    """Its draw raises."""

    def draw(self, rng, n):
        raise KeyError("rows")
