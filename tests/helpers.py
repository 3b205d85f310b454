"""Helpers the test modules share (pytest puts this folder on sys.path, beside conftest.py)."""

from __future__ import annotations

from rlgen.config import AlgoConfig


def algo_cfg(**values) -> AlgoConfig:
    """An AlgoConfig with concrete values where the dataclass leaves them null for the plan to fill: the tiny
    recipe's learning rate, 8 new tokens and one micro-batch of the whole batch."""
    return AlgoConfig(**{"lr": 1e-3, "max_new_tokens": 8, "micro_batch_size": 0, **values})
