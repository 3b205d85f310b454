"""Helpers the test modules share (pytest puts this folder on sys.path, beside conftest.py)."""

from __future__ import annotations

from rlgen.config import AlgoConfig


def algo_cfg(**values) -> AlgoConfig:
    """An AlgoConfig with concrete values where the dataclass leaves them null for the plan to fill: the tiny
    recipe's learning rate, 8 new tokens and one micro-batch of the whole batch."""
    return AlgoConfig(**{"lr": 1e-3, "max_new_tokens": 8, "micro_batch_size": 0, **values})


MIN_REWARD_GAIN = 0.2  # what the embedded default run must learn by on a [0, 1] reward (make smoke)


def assert_learned(records: list[dict], summary: dict, min_gain: float = MIN_REWARD_GAIN) -> None:
    """The mean reward of the last fifth of the steps beats the first fifth's by min_gain, as the summary says."""
    import pytest

    k = len(records) // 5
    first = sum(r["reward_mean"] for r in records[:k]) / k
    last = sum(r["reward_mean"] for r in records[-k:]) / k
    assert last - first >= min_gain, f"reward rose only {first:.3f} -> {last:.3f}"
    assert summary["reward_gain"] == pytest.approx(last - first)
