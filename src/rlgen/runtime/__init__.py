"""The run, split by time: setup (plan -> actors: a Run), loop (the steps), checkpoint (save and restore, as
functions of the Run and its RunState), run (the three as one library call), and the pieces they use: actors,
cluster, files, transports, rollouts, faults (engine restarts), waits, stop (signals), status, resume."""

from rlgen.runtime.errors import RunError, RunStopped, StopRequested, actor_death_detail

__all__ = ["RunError", "RunStopped", "StopRequested", "actor_death_detail"]
