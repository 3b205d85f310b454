"""How a run ends early: RunError (it cannot go on), RunStopped (it stopped cleanly, resumable), WriteStopped (a
write it needs failed), and what killed an actor, in a line."""

from __future__ import annotations

import re

from rlgen.engines.base import EngineStartError
from rlgen.errors import UserError


class RunError(UserError, RuntimeError):
    """The run cannot go on; the message says why and what to do."""

    exit_code = 1


class RunStopped(RunError):
    """The run stopped cleanly: a signal, or a fault it could not recover from. ``checkpoint`` is the newest
    complete checkpoint (None when there is none), from which ``resume=`` continues; ``exit_code`` is what the
    command exits with (130 for SIGINT, 143 for SIGTERM, 1 for a fault)."""

    def __init__(self, message: str, *, exit_code: int, step: int, checkpoint: str | None = None):
        super().__init__(message)
        self.exit_code, self.step, self.checkpoint = int(exit_code), int(step), checkpoint


class WriteStopped(RunError):
    """A write the run needs failed (a full disk, a folder that cannot be written): the message says what was not
    written and the fix; where the run ends, the command that resumes it is added (rlgen.runtime.run)."""


class StopRequested(Exception):
    """Raised inside the driver's waits once a stop was asked for; the loop turns it into a clean stop."""


def actor_death_detail(err: BaseException, limit: int = 1500) -> str:
    """What killed an actor: the first line of Ray's message and, for an actor whose constructor raised, the
    exception it raised (the last lines of the creation task's traceback)."""
    lines = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(err)).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    marker = f"{EngineStartError.__name__}: "
    start_error = next((ln.split(marker, 1)[1] for ln in lines if marker in ln), None)
    if start_error:  # an engine that explained why it could not start: that sentence is the whole story
        return start_error[:limit]
    head = lines[0][:300]
    frames = [i for i, ln in enumerate(lines) if ln.lstrip().startswith('File "')]
    start = frames[-1] + 2 if frames else 1  # past the last frame and its source line: the exception itself
    tail = [ln.strip() for ln in lines[start:]][:4]
    return (head + (": " + " | ".join(tail) if tail else ""))[:limit]
