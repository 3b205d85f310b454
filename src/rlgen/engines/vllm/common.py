"""What the vllm engine's modules share: its error, the limits of its waits, and the sentence for a failed NCCL
join."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

START_TIMEOUT_S = 900.0  # building the engine: weights, torch.compile, CUDA graphs
CALL_TIMEOUT_S = 1800.0  # one generate() call
CONTROL_TIMEOUT_S = 300.0  # sleep, wake, pause, resume, prefix-cache reset, one weight chunk


class EngineError(RuntimeError):
    """The engine cannot do what was asked; the message says why and what to do."""


def nccl_join_failed(name: str, init_info: Mapping[str, Any], err: BaseException) -> str:
    """One sentence for a trainer's NCCL group that an engine could not join: where, NCCL's own words, and the
    usual cause (the two ends differ in NCCL_CUMEM_ENABLE; vLLM's engines run with 0)."""
    words = (str(err).strip().splitlines() or [type(err).__name__])[-1]
    return (f"{name} could not join the trainer's NCCL group at {init_info.get('master_address')}:"
            f"{init_info.get('master_port')} ({words}); this engine runs with NCCL_CUMEM_ENABLE="
            f"{os.environ.get('NCCL_CUMEM_ENABLE', 'unset')}, and a trainer process that differs in it is the usual "
            "cause: start the trainer with the same value.")


__all__ = ["CALL_TIMEOUT_S", "CONTROL_TIMEOUT_S", "START_TIMEOUT_S", "EngineError", "nccl_join_failed"]
