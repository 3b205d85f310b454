"""The run, split by time and by concern.

Top level: ``run`` (plan -> set-up -> loop -> report, as one library call), ``setup`` (plan -> actors: a Run),
``loop`` (the steps), ``signals`` (clean stops) and ``errors``.
Subpackages, lowest first: ``cluster`` (Ray, actors, waits, kept engines, a dead run's leftovers), ``rollouts``
(requests, in-flight generation, refill, engine restarts), ``durability`` (checkpoints, resume, disk space, the
run folder's lock and status), ``policy`` (the run's state, the weight transports, the circuit breaker) and
``start`` (set-up's loaders and progress lines). docs/architecture.md walks one step through these files."""

from rlgen.runtime.errors import RunError, RunStopped, StopRequested, actor_death_detail

__all__ = ["RunError", "RunStopped", "StopRequested", "actor_death_detail"]
