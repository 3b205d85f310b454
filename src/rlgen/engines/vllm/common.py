"""What the vllm engine's modules share: its error and the limits of its waits."""

from __future__ import annotations

START_TIMEOUT_S = 900.0  # building the engine: weights, torch.compile, CUDA graphs
CALL_TIMEOUT_S = 1800.0  # one generate() call
CONTROL_TIMEOUT_S = 300.0  # sleep, wake, pause, resume, prefix-cache reset, one weight chunk


class EngineError(RuntimeError):
    """The engine cannot do what was asked; the message says why and what to do."""


__all__ = ["CALL_TIMEOUT_S", "CONTROL_TIMEOUT_S", "START_TIMEOUT_S", "EngineError"]
