"""What the transports read of a run's plan, as read-only protocols: where the engines and the learner ranks sit.
``rlgen.plan.Plan`` has these attributes; the plan sits above weight sync, so this is how a transport names what it
takes from it without importing it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class EngineSeat(Protocol):
    """Where one engine runs: its node and its GPUs there."""

    @property
    def node(self) -> int: ...
    @property
    def gpus(self) -> tuple[int, ...]: ...


class LearnerSeat(Protocol):
    """Where one learner rank runs: its rank, node and GPU (None on CPU)."""

    @property
    def rank(self) -> int: ...
    @property
    def node(self) -> int: ...
    @property
    def gpu(self) -> int | None: ...


class SyncPlan(Protocol):
    """The plan as the transports read it: the engines' and the learner ranks' seats."""

    @property
    def engines(self) -> Sequence[EngineSeat]: ...
    @property
    def learners(self) -> Sequence[LearnerSeat]: ...


__all__ = ["EngineSeat", "LearnerSeat", "SyncPlan"]
