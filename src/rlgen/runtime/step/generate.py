"""Generate: the step's flight launched (with the flights up to ``state.async_steps`` steps ahead of it), waited
for, and taken off the queue; its engines' spans go on the step's timeline. The engines' side (flights, collection,
restarts) is ``rlgen.runtime.rollouts.generation``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rlgen import launched_at
from rlgen.runtime.cluster.waits import LearnerLost
from rlgen.runtime.rollouts.generation import Rollouts
from rlgen.runtime.rollouts.in_flight import InFlight
from rlgen.runtime.rollouts.tail import tail_metrics
from rlgen.runtime.setup import Run
from rlgen.types import Phase, StepTimeline


@dataclass
class Generated:
    """The step's flight, collected (its completions not yet prepared), and its generation tail's metrics."""

    flight: InFlight
    tail: dict[str, float]  # gen/tail_s, gen/tail_filled (rlgen.runtime.rollouts.tail); {} where engines give none


def generate(run: Run, step: int, tl: StepTimeline) -> Generated:
    """The step's flight, collected: the learner's wait for it and the engines' generate and update spans go on
    the timeline. The flights after it go out meanwhile, up to state.async_steps steps ahead."""
    ro = run.rollouts
    # The run's first batch generates alone: nothing trains meanwhile, and a batch launched ahead beside it would
    # share the engines' steps and delay it. Later batches go ahead at once, to generate while this one trains.
    ro.fill(step, run.state.async_steps if ro.collected else 0, run.transport.version)
    t0 = time.time()
    flight = ro.next_flight()
    ro.fill(step, run.state.async_steps, run.transport.version)
    tail = tail_metrics(flight, ro.ahead())
    run.startup.setdefault("first_rollout_s", time.time() - launched_at())
    if run.clock is not None:
        run.clock.first_batch()
    tl.add("learner0", Phase.wait, t0, time.time())
    add_engine_spans(run, tl, flight)
    return Generated(flight, tail)


@contextmanager
def kept_for_resume(ro: Rollouts, flight: InFlight) -> Iterator[None]:
    """Around the learners' work on a flight: where a learner rank is lost, the flight goes back to the head of
    the queue, so the step runs again on resume on these rollouts where they were generated ahead."""
    try:
        yield
    except LearnerLost:
        ro.put_back(flight)
        raise


def add_engine_spans(run: Run, tl: StepTimeline, flight: InFlight) -> None:
    """A collected flight's engine spans (its generate calls' and the weight updates' queued before them)."""
    for i, res in flight.results.items():
        for phase, a, b in res.spans:
            tl.add(run.engine_names[i], Phase(phase), a, b)
    for i, spans in flight.update_spans.items():
        for phase, a, b in spans:
            tl.add(run.engine_names[i], Phase(phase), a, b)


__all__ = ["Generated", "add_engine_spans", "generate", "kept_for_resume"]
