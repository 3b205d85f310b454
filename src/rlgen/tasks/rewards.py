"""Reward functions: (completion text, reference answer) -> float in [0, 1]. Pure Python.

A task names its reward by a registered name, or as "package.module:function" for a user's own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

RewardFn = Callable[[str, str], float]


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


REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "contains": contains,
    "char_match": char_match,
    "numeric": numeric,
}


def resolve_reward(spec: str) -> RewardFn:
    if spec in REWARDS:
        return REWARDS[spec]
    if ":" not in spec:
        raise RewardSpecError(
            f"task.reward={spec!r} is not a known reward; use one of {', '.join(sorted(REWARDS))}, "
            "or 'package.module:function' for your own."
        )
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise RewardSpecError(
            f"task.reward={spec!r} cannot be loaded ({err}); check that {module} is importable and defines {name}."
        ) from err
    if not callable(fn):
        raise RewardSpecError(f"task.reward={spec!r} is not callable; it must be f(completion: str, answer: str) -> float.")
    return fn
