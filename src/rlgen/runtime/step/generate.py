"""Generate: the step's flight launched (with the flights up to ``state.async_steps`` steps ahead of it), waited
for, and taken off the queue; its engines' spans go on the step's timeline. The engines' side (flights, collection,
restarts) is ``rlgen.runtime.rollouts.generation``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rlgen import launched_at
from rlgen.config import LaunchAhead
from rlgen.runtime.cluster.waits import LearnerLost
from rlgen.runtime.rollouts.generation import Rollouts
from rlgen.runtime.rollouts.in_flight import InFlight
from rlgen.runtime.rollouts.tail import tail_metrics
from rlgen.runtime.run_handle import Run
from rlgen.types import Phase, StepTimeline

# whether the flights ahead go out while the step's own flight is waited for (algo.launch_ahead)
WHILE_WAITING = {LaunchAhead.step_start: True, LaunchAhead.own_in: False}


@dataclass
class Generated:
    """The step's flight, collected (its completions not yet prepared), and its generation tail's metrics."""

    flight: InFlight
    # gen/tail_s, gen/tail_filled (rlgen.runtime.rollouts.tail; {} where engines give none), and
    # gen/launch_ahead_s: how long after the step began the flight async_steps ahead went out (its pace)
    tail: dict[str, float]


def generate(run: Run, step: int, tl: StepTimeline) -> Generated:
    """The step's flight, collected: the learner's wait for it and the engines' generate and update spans go on
    the timeline. The flights after it go out meanwhile, up to state.async_steps steps ahead."""
    services = run.services
    ro, depth = run.built.rollouts, run.state.async_steps
    t0 = time.time()
    ro.pace.step_began(t0)
    # The run's first batch generates alone: nothing trains meanwhile, and a batch launched ahead beside it would
    # share the engines' steps and delay it. Later batches go ahead while this one is waited for, each at its
    # pace (rlgen.runtime.rollouts.pace: so steps do not alternate), and once it is in, at once.
    # With algo.launch_ahead=own_in (rlgen.plan.launch_ahead) they wait for it instead, as the first step's do.
    version = run.built.transport.version
    beside = ro.collected > 0 and WHILE_WAITING[run.cfg.algo.launch_ahead or LaunchAhead.step_start]
    ro.fill(step, depth if beside else 0, version, paced=True)
    flight = ro.next_flight(launch=(lambda: ro.fill(step, depth, version, paced=True)) if beside else None)
    ro.fill(step, depth, version)
    tail = tail_metrics(flight, ro.ahead())
    last = ro.waiting()[-1] if ro.collected > 1 and ro.waiting() else None
    if last is not None and last.step == step + depth and last.launched_at is not None:
        tail["gen/launch_ahead_s"] = max(0.0, last.launched_at - t0)  # how long its pace held the flight ahead
    services.startup.setdefault("first_rollout_s", time.time() - launched_at())
    if services.clock is not None:
        services.clock.first_batch()
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
        tl.add_spans(run.built.engine_names[i], res.spans)
    for i, spans in flight.update_spans.items():
        tl.add_spans(run.built.engine_names[i], spans)


__all__ = ["Generated", "add_engine_spans", "generate", "kept_for_resume"]
