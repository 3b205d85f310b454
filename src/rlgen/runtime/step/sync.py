"""Sync: the engines and the learner's new version. Colocated engines sleep while the learners work
(``sleep_engines``); after the step the circuit breaker judges the learner's metrics (warn, tighten: async_steps to
0, or halt), and the new version goes to the engines, or, after a skipped step or on a halt, they wake on their old
weights (``wake_engines``). Where the object store carries an update, the engines' loads still running
(PushResult.pending) wait in the Rollouts queue, applied before each engine's next generate; the run's last ones
are waited for at its end (``finish_updates``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from rich.markup import escape

from rlgen.config import BreakerAction
from rlgen.runtime.durability.learner_loss import WeightUpdateHung
from rlgen.runtime.errors import RunError, StopRequested
from rlgen.runtime.run_handle import Run
from rlgen.runtime.step.advantages import Batch
from rlgen.runtime.step.train import Trained
from rlgen.sync.transports.base import PushResult
from rlgen.sync.waits import SyncError, SyncTimeoutError
from rlgen.types import Phase, StepTimeline

T = TypeVar("T")


@dataclass
class Synced:
    """The sync phase's result: the breaker's halt message (None: the run goes on) and its metrics."""

    halt: str | None
    metrics: dict[str, float] = field(default_factory=dict)  # sync_<part>_s of the push, then the breaker's state


def sleep_engines(run: Run, tl: StepTimeline) -> None:
    """Colocated engines go to sleep while the learners work (their spans on the timeline); others generate on."""
    for r in over_engines(run, run.built.transport.sleep_engines):
        tl.add_spans(r["actor"], r["spans"])


def sync(run: Run, step: int, trained: Trained, batch: Batch, tl: StepTimeline) -> Synced:
    """The breaker's verdict on the step, then the new version to the engines, unless the step was skipped or the
    breaker halts the run (then they wake on their old weights)."""
    state = run.state
    event = state.breaker.update(step, trained.metrics, batch.rows)
    halt = event is not None and event.action is BreakerAction.halt
    if event is not None:
        run.services.sink.console.print(f"[yellow]breaker:[/] {escape(event.message)}", highlight=False)
        if event.action is BreakerAction.tighten:
            state.async_steps = 0
    metrics: dict[str, float] = {}
    if trained.result.skipped:
        over_engines(run, run.built.transport.wake_engines)  # colocated: wake the engines on their old weights
    else:
        state.version = trained.result.version
        if halt:
            over_engines(run, run.built.transport.wake_engines)
        else:
            metrics = _push(run, tl)
    return Synced(event.message if halt else None, {**metrics, **state.breaker.metrics()})


def _push(run: Run, tl: StepTimeline) -> dict[str, float]:
    """state.version to every engine; the push's spans on the timeline. Returns sync_<part>_s: where the update's
    time went, the slowest actor's."""
    built = run.built
    state, metrics = run.state, {}
    in_flight = state.async_steps > 0 and built.rollouts.ahead() is not None
    if in_flight and run.cfg.deterministic:
        between_flights(run, tl)
        in_flight = False
    try:
        res: PushResult = over_engines(run, lambda: built.transport.push(state.version, in_flight=in_flight),
                                       resync=False)
    except SyncTimeoutError as err:
        cfg = run.cfg
        key = "runtime.hang_timeout_s" if cfg.runtime.hang_timeout_s <= cfg.timeout_s else "timeout_s"
        raise WeightUpdateHung(f"the weight update to version {state.version} did not finish within {key}="
                               f"{min(cfg.runtime.hang_timeout_s, cfg.timeout_s):g} ({err})") from err
    except SyncError as err:
        raise RunError(f"weight sync to version {state.version} failed: {err}") from err
    for r in res.results:
        tl.add_spans(r["actor"], r.get("spans", []))
        for part, seconds in r.get("parts", {}).items():  # where an update's time went, the slowest actor's
            metrics[f"sync_{part}_s"] = max(seconds, metrics.get(f"sync_{part}_s", 0.0))
    # the object store's loads still running: each engine takes its own before its next generate
    built.rollouts.queue_updates(res.pending)
    return metrics


def between_flights(run: Run, tl: StepTimeline) -> None:
    """A deterministic run's weights change between flights only: the flights ahead finish on the old weights
    before the update. Where an update lands inside a flight (the tokens sampled after it) depends on timing, so
    two runs of one seed would part there. The learner's wait for them goes on the timeline."""
    t0 = time.time()
    for flight in run.built.rollouts.waiting():
        run.built.rollouts.collect(flight)
    tl.add("learner0", Phase.wait, t0, time.time())


def over_engines(run: Run, call: Callable[[], T], resync: bool = True) -> T:
    """call() of the transport over every engine; when it failed because engines are gone (an actor, or the
    engine core inside one), they are re-created, and call() runs once more. resync: the new engines get the
    weights the engines had first; a push passes False, since its retry gives every engine the new ones (the
    learner holds only those)."""
    try:
        return call()
    except StopRequested:
        raise
    except Exception as err:
        if not run.built.keeper.replace_dead(err, resync):
            raise
    return call()


def finish_updates(run: Run) -> None:
    """Surface any failure of the last weight update rather than dropping it."""
    from ray.exceptions import RayActorError

    for i, (inc, ref) in run.built.rollouts.take_queued_updates().items():
        try:
            run.services.waiter.get(ref, "final weight update", interruptible=False)
        except RunError as err:
            if not isinstance(err.__cause__, RayActorError):
                raise
            run.built.keeper.is_dead(i, inc, err.__cause__)


__all__ = ["Synced", "between_flights", "finish_updates", "over_engines", "sleep_engines", "sync"]
