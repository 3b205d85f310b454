"""A verifiers ToolEnv with one Python tool, for the task=verifiers tests: add two numbers with the tool, then
answer; the rubric scores the final answer."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def final_answer(completion, answer, **kwargs) -> float:
    text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
    return 1.0 if (text or "").strip() == str(answer) else 0.0


def load_environment() -> vf.Environment:
    rows = [{"question": f"What is {a} plus {b}? Use the add tool.", "answer": str(a + b)} for a, b in
            [(2, 3), (4, 4), (1, 6)]]
    return vf.ToolEnv(tools=[add], dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[final_answer]),
                      max_turns=3)
