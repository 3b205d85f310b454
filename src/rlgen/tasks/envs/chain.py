"""``chain``: chained addition, a multi-turn game small enough for the embedded CPU default to learn.

The prompt is ``a+b=``. After each answer the environment writes ``+c=`` and the policy answers again, for
``links`` turns in all; a turn whose answer is the running total (the true one, whatever was said before) scores
1/links. The later turns need the earlier ones' context: the policy's own answer and the operands the
environment wrote."""

from __future__ import annotations

import random

from rlgen.charvocab import EOS
from rlgen.tasks.base import Prompt
from rlgen.tasks.envs import Step, register_env


@register_env("chain")
class ChainEnv:
    def __init__(self, links: int = 2, max_operand: int = 10):
        if links < 1 or max_operand < 1:
            raise ValueError("links and max_operand must be at least 1")
        self.links, self.max_operand = int(links), int(max_operand)
        self.total, self.turn, self.rng = 0, 0, random.Random(0)

    # -- prompts and demonstrations (the task draws them with a generator of its own) --------------------
    def draw(self, rng: random.Random, n: int) -> list[Prompt]:
        out = []
        for _ in range(n):
            a, b = rng.randrange(self.max_operand), rng.randrange(self.max_operand)
            out.append(Prompt(f"{a}+{b}=", str(a + b)))
        return out

    def demonstrations(self, rng: random.Random, n: int) -> list[Prompt]:
        """Whole transcripts: the first answer, then each ``+c=`` and its answer after the end-of-sequence."""
        out = []
        for p in self.draw(rng, n):
            total, answer = int(p.answer), p.answer
            for _ in range(self.links - 1):
                c = rng.randrange(self.max_operand)
                total += c
                answer += f"{EOS}+{c}={total}"
            out.append(Prompt(p.text, answer))
        return out

    # -- the episode --------------------------------------------------------------------------------------
    def reset(self, prompt: Prompt, seed: int) -> None:
        self.total, self.turn, self.rng = int(prompt.answer), 0, random.Random(seed)

    def step(self, action: str) -> Step:
        self.turn += 1
        reward = 1.0 / self.links if action.strip() == str(self.total) else 0.0
        if self.turn >= self.links:
            return Step(None, reward, True)
        c = self.rng.randrange(self.max_operand)
        self.total += c
        return Step(f"+{c}=", reward, False)
