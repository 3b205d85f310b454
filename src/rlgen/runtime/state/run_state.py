"""What changes while a run runs: the one value the loop updates and a checkpoint saves. The plan holds what was
decided before the start; anything that changes later (the breaker dropping async_steps, the policy version, a
resume) lives here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlgen.runtime.durability.background_write import BackgroundWrite
    from rlgen.runtime.durability.resume import ResumePoint
    from rlgen.runtime.state.breaker import CircuitBreaker


@dataclass
class RunState:
    step: int = 0  # steps finished: the next step to run
    version: int = 0  # the learner's policy version; engines start with the same weights
    async_steps: int = 0  # how far engines may run ahead: the plan's, until the breaker tightens it to 0
    breaker: CircuitBreaker | None = None  # a checkpoint saves its state
    wall_before: float = 0.0  # wall time the run spent before this resume
    last_checkpoint: Path | None = None
    checkpoint_seconds: list[float] = field(default_factory=list)  # what each checkpoint cost the loop
    weights_only: Path | None = None  # final_model/ written without a checkpoint: the disk had no room for one
    weights_only_note: str = ""  # the sentence saying so, and what it means for resuming
    background_write: BackgroundWrite | None = None  # a checkpoint the learners are still completing
    rank_rng: dict[int, tuple[int, str]] = field(default_factory=dict)  # rank -> (steps done, its RNG digest)

    @classmethod
    def start(cls, async_steps: int, breaker: CircuitBreaker) -> RunState:
        """A new run, with the plan's async_steps."""
        return cls(async_steps=int(async_steps), breaker=breaker)

    @classmethod
    def resumed(cls, point: ResumePoint, breaker: CircuitBreaker) -> RunState:
        """The state a checkpoint saved, the breaker loaded with its part."""
        s = point.state
        breaker.load_state_dict(s.get("breaker", {}))
        return cls(step=int(s["step"]), version=int(s["version"]), async_steps=int(s["async_steps"]), breaker=breaker,
                   wall_before=float(s.get("wall_s", 0.0)), last_checkpoint=point.checkpoint)


__all__ = ["RunState"]
