"""What every engine raises when it cannot start or can no longer work. The calls every engine answers, and those
of each capability a kind claims, are ``rlgen.engines.contract``'s protocols (``Engine`` is re-exported here)."""

from __future__ import annotations

from rlgen.engines.contract import Engine
from rlgen.errors import causes
from rlgen.types import Completion, GenRequest

COULD_NOT_START = " could not start: "  # between the engine's name and why, in every EngineStartError


class EngineStartError(RuntimeError):
    """An engine that cannot start; the message is one sentence with the fix."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}{COULD_NOT_START}{why}")


class EngineDead(RuntimeError):
    """The engine inside a live actor can no longer work: vLLM's engine core process died, or a CUDA error left
    its GPU state unusable. The actor answers, but only a new actor helps: the run re-creates it in its place,
    gives it the current weights and sends its requests again (rlgen.runtime.rollouts.engine_restarts)."""


def engine_died(err: BaseException) -> bool:
    """Whether a failed call means an engine is gone: an actor that died, or an engine that raised EngineDead,
    also when it reached us through another actor's call (an IPC update goes through the learner)."""
    from ray.exceptions import RayActorError

    return any(isinstance(e, (RayActorError, EngineDead)) for e in causes(err))


__all__ = ["COULD_NOT_START", "Completion", "Engine", "EngineDead", "EngineStartError", "GenRequest", "engine_died"]
