"""The run, split by time and by concern.

Top level: ``run`` (plan -> set-up -> loop -> report, as one library call), ``setup`` (plan -> actors: a Run),
``run_handle`` (the Run set-up fills in), ``loop`` (the steps), ``signals`` (clean stops) and ``errors``.
Subpackages, lowest first: ``cluster`` (Ray, actors, waits, kept engines, a dead run's leftovers),
``rollouts`` (requests, in-flight generation, refill, engine restarts), ``durability`` (checkpoints, resume,
disk space, the run folder's lock and status), ``state`` (what changes while the run runs, the circuit breaker)
and ``start`` (set-up's loaders, the weight transport, progress lines). docs/architecture.md walks one step
through these files."""

from rlgen.runtime.errors import RunError, RunStopped, StopRequested, actor_death_detail

__all__ = ["RunError", "RunStopped", "StopRequested", "actor_death_detail"]
