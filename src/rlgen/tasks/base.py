"""What every task provides: prompts for RL, demonstrations for the warm start, and a reward. Pure Python."""

from __future__ import annotations

import math
import numbers
import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Prompt:
    text: str
    answer: str
    source: str = field(default="", compare=False)  # where it came from, for messages: "rows.jsonl:7"


class TaskDataError(ValueError):
    """A task's data or settings cannot be used; the message says where and how to fix it."""


@runtime_checkable
class Task(Protocol):
    name: str

    def prompts(self, step: int, n: int) -> list[Prompt]:
        """n prompts for an RL step; the same (task seed, step) always gives the same list."""
        ...

    def demonstrations(self, n: int, seed: int) -> list[Prompt]:
        """n prompts with their answers for supervised warm start."""
        ...

    def reward(self, completion: str, prompt: Prompt) -> float:
        """Score of a decoded completion (special tokens skipped), in [0, 1]."""
        ...


def step_rng(seed: int, stream: str, step: int) -> random.Random:
    """A generator private to (task seed, stream, step), independent of any global random state."""
    return random.Random(f"{seed}/{stream}/{step}")


class RewardValueError(TypeError):
    """A reward function returned something that is not a number."""


def clamp_reward(value: object) -> float:
    """A reward function's result clamped into [0, 1]; NaN counts as 0. Anything but a real number (bool,
    int, float, a NumPy scalar, a 0-d tensor) raises RewardValueError."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise RewardValueError(f"returned {value!r:.60} (a {type(value).__name__}), not a number")
    value = float(value)
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, value))
