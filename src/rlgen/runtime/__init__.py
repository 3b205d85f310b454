"""The run, split by time: actors (set-up), orchestrator (the loop), checkpoint and resume, faults (engine
restarts), stop (signals) and status (status.json)."""

from rlgen.runtime.errors import RunError, RunStopped, StopRequested, actor_death_detail
from rlgen.runtime.orchestrator import Orchestrator

__all__ = ["Orchestrator", "RunError", "RunStopped", "StopRequested", "actor_death_detail"]
