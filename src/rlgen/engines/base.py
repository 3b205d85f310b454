"""What every engine raises when it cannot start or can no longer work (EngineDead and engine_died live in
``rlgen.errors``, since the weight transports, below the engines, look for them too). The calls every engine answers, and those
of each capability a kind claims, are ``rlgen.engines.contract``'s protocols (``Engine`` is re-exported here)."""

from __future__ import annotations

from rlgen.engines.contract import Engine
from rlgen.errors import EngineDead, engine_died
from rlgen.types import Completion, GenRequest

COULD_NOT_START = " could not start: "  # between the engine's name and why, in every EngineStartError


class EngineStartError(RuntimeError):
    """An engine that cannot start; the message is one sentence with the fix."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}{COULD_NOT_START}{why}")


__all__ = ["COULD_NOT_START", "Completion", "Engine", "EngineDead", "EngineStartError", "GenRequest", "engine_died"]
