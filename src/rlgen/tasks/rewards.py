"""Reward functions: (completion text, reference answer) -> float in [0, 1]. Pure Python.

A task names its reward by a registered name, or as "package.module:function" for a user's own.
"""

from __future__ import annotations

import importlib
import math
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlgen.tasks.math_reward import format_reward, math_equal

RewardFn = Callable[[str, str], float]


class RewardValueError(TypeError):
    """A reward function returned something that is not a number."""


def clamp_reward(value: object) -> float:
    """A reward function's result clamped into [0, 1]. NaN stays NaN: the completion then gets advantage 0 and is
    counted (reward/nan) rather than scored as a 0 that would move its group's mean. Anything but a real number
    (bool, int, float, a NumPy scalar, a 0-d tensor) raises RewardValueError."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise RewardValueError(f"returned {value!r:.60} (a {type(value).__name__}), not a number")
    value = float(value)
    if math.isnan(value):
        return value
    return min(1.0, max(0.0, value))


class RewardSpecError(ValueError):
    pass


def exact_match(completion: str, answer: str) -> float:
    return 1.0 if completion.strip() == answer.strip() else 0.0


def contains(completion: str, answer: str) -> float:
    return 1.0 if answer.strip() and answer.strip() in completion else 0.0


def char_match(completion: str, answer: str) -> float:
    """Fraction of the answer's characters matched position by position; extra characters cost."""
    got, want = completion.strip(), answer.strip()
    if not want:
        return 0.0
    hits = sum(1 for a, b in zip(got, want) if a == b)
    return hits / max(len(want), len(got))


def numeric(completion: str, answer: str) -> float:
    try:
        return 1.0 if abs(float(completion.strip()) - float(answer.strip())) < 1e-6 else 0.0
    except ValueError:
        return 0.0


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(completion: str, answer: str) -> float:
    """1 when the last number in the completion (commas between digits allowed) equals the answer's."""
    found = _NUMBER.findall(completion)
    if not found:
        return 0.0
    return numeric(found[-1].replace(",", ""), answer.replace(",", ""))


def math_reward(completion: str, answer: str) -> float:
    """Mathematical equality of the final answer (rlgen.tasks.math_reward; needs math-verify)."""

    return math_equal(completion, answer)


def answer_format(completion: str, answer: str) -> float:
    """1 when the completion states its answer in a \\boxed{} or after ####."""

    return format_reward(completion, answer)


REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "contains": contains,
    "char_match": char_match,
    "numeric": numeric,
    "last_number": last_number,
    "math": math_reward,
    "format": answer_format,
}
NEEDS = {"math": "math_verify"}  # rewards that import a package of their own


class RewardCallError(RuntimeError):
    """One reward of a RewardSet raised or returned a non-number; ``name`` says which."""

    def __init__(self, name: str, cause: BaseException):
        super().__init__(f"{name}: {cause}")
        self.name, self.cause = name, cause


@dataclass
class RewardSet:
    """The task's rewards and their weights: the total is the weighted sum, each part is clamped to [0, 1]
    and logged on its own (reward/<name>). One reward of weight 1 is just that reward."""

    parts: list[tuple[str, RewardFn, float]]

    @classmethod
    def from_config(cls, cfg: Any) -> RewardSet:
        spec = dict(cfg.rewards) if cfg.rewards else {cfg.reward: 1.0}
        label = "task.rewards" if cfg.rewards else "task.reward"
        return cls([(name, resolve_reward(name, label), float(weight)) for name, weight in spec.items()])

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.parts]

    def score(self, completion: str, answer: str) -> tuple[float, dict[str, float]]:
        values: dict[str, float] = {}
        for name, fn, _ in self.parts:
            try:
                values[name] = clamp_reward(fn(completion, answer))
            except Exception as err:  # noqa: BLE001 - a user's function: whatever it raises is reported
                raise RewardCallError(name, err) from err
        return sum(w * values[name] for name, _, w in self.parts), values


def resolve_reward(spec: str, label: str = "task.reward") -> RewardFn:
    """The reward function a spec names (label: the setting it came from, for messages)."""
    if spec in REWARDS:
        return REWARDS[spec]
    if ":" not in spec:
        raise RewardSpecError(
            f"{label}={spec!r} is not a known reward; use one of {', '.join(sorted(REWARDS))}, "
            "or 'package.module:function' for your own."
        )
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise RewardSpecError(
            f"{label}={spec!r} cannot be loaded ({err}); check that {module} is importable and defines {name}."
        ) from err
    if not callable(fn):
        raise RewardSpecError(f"{label}={spec!r} is not callable; it must be f(completion: str, answer: str) -> float.")
    return fn
