"""The engine protocol. Every engine (hf, vllm) runs as a Ray actor and answers these calls."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class Engine(Protocol):
    def generate(self, requests: list[GenRequest], version: int | None = None) -> dict[str, Any]:
        """Token-in/token-out. Returns {"completions": list[Completion] (n per request, in request order),
        "spans": [(phase, start, end), ...], "version": int}."""

    def update_weights(self, weights: Any, version: int) -> dict[str, Any]:
        """Load new policy weights (a name -> tensor mapping, or a transport handle). Returns
        {"version": int, "spans": [...]}."""

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory (weights and KV cache) until wake()."""

    def wake(self) -> None:
        ...

    def health(self) -> dict[str, Any]:
        """{"ok": bool, "version": int, ...}; cheap, answers within a second."""


__all__ = ["COULD_NOT_START", "Completion", "Engine", "EngineDead", "EngineStartError", "GenRequest"]
