"""What a balance verdict's advice may change: the run's engines, how far they run ahead, and the room the plan
found on the hardware (rlgen.metrics.balance reads it; rlgen.metrics.room_advice names engines and GPUs from it).
Pure Python."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BalanceContext:
    """What the advice may change. num_engines None: counted from the timeline."""

    num_engines: int | None = None
    async_steps: int = 0
    tensor_parallel_size: int = 1
    colocated: bool = False  # engines share the learners' GPUs (they overlap only with async_steps > 0)
    device: str = ""  # "cpu" | "cuda" | "" (unknown): picks the words of the advice
    # what the hardware leaves room for (plan.room); None: unknown, the advice then names engines freely
    free_gpus: int | None = None
    learner_gpus: int = 0  # GPUs of their own the learners hold (0 when colocated)
    engine_gpus: int = 0
    engines_per_gpu_next: int | None = None  # one more engine per GPU fits (None: it does not, or unknown)
    runs_ahead: bool = True  # engines run ahead here by default (False on CPU: no advice to raise async_steps)
    episodes: bool = False  # a multi-turn task (task.kind=env): a batch's last episodes wait on their environment
    hybrid: bool = False  # engines on GPUs of their own that could share every GPU with a learner rank instead
    bigger_hardware: tuple[tuple[str, int], ...] = ()  # presets with more GPUs, fewest first: (name, GPUs)
    partial: bool = False  # algo.partial_rollouts is on: the generation tail is carried already


NO_CONTEXT = BalanceContext()  # nothing known: engines counted from the timeline, on-policy


def context_from_plan(plan: Any) -> BalanceContext:
    """A BalanceContext from a Plan or its ``to_dict()`` / plan.json contents."""
    d = plan.to_dict() if hasattr(plan, "to_dict") else dict(plan)
    engines = d.get("engines") or []
    tp = int(engines[0].get("tensor_parallel_size", 1)) if engines else 1
    room = d.get("room") or {}
    return BalanceContext(
        num_engines=len(engines) or None,
        async_steps=int(d.get("async_steps", 0)),
        tensor_parallel_size=tp,
        colocated=bool(d.get("colocated", False)),
        device=str(d.get("device", "")),
        free_gpus=room.get("free_gpus"),
        learner_gpus=int(room.get("learner_gpus", 0)),
        engine_gpus=int(room.get("engine_gpus", 0)),
        engines_per_gpu_next=room.get("engines_per_gpu_next"),
        runs_ahead=bool(room.get("runs_ahead", True)),
        episodes=((d.get("config") or {}).get("task") or {}).get("kind") == "env",
        hybrid=bool(room.get("hybrid", False)),
        bigger_hardware=tuple((str(n), int(g)) for n, g in room.get("bigger_hardware", ())),
        partial=bool(((d.get("config") or {}).get("algo") or {}).get("partial_rollouts") or 0),
    )


__all__ = ["NO_CONTEXT", "BalanceContext", "context_from_plan"]
