"""A verifiers environment built with the library's own classes (MultiTurnEnv, Rubric, a dataset of rows), for
the task=verifiers tests: chained addition over two turns. After the first answer the environment asks to add
another number; the rubric scores the last answer against the running total. Loaded by id (this module's name)
with verifiers' own load_environment."""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset


class ChainGame(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        c = state["info"]["add"]
        return [{"role": "user", "content": f"+{c}="}]


def last_total(completion, answer, **kwargs) -> float:
    text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
    return 1.0 if text.strip() == str(answer) else 0.0


def load_environment(rows: int = 64, max_operand: int = 5, seed: int = 0) -> vf.Environment:
    rng = random.Random(seed)
    data = []
    for _ in range(rows):
        a, b, c = (rng.randrange(max_operand) for _ in range(3))
        data.append({"question": f"{a}+{b}=", "answer": str(a + b + c), "info": {"add": c}})
    return ChainGame(dataset=Dataset.from_list(data), rubric=vf.Rubric(funcs=[last_total]), max_turns=2)
