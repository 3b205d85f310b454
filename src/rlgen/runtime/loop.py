"""The GRPO loop over a set-up Run. One step: engines generate the step's rollouts (policy version v), the driver
scores them and computes their advantages, the learner trains (v -> v+1), the new weights go to the engines, and
the step's record is written. Up to ``state.async_steps`` generations run ahead of the learner, so generation of
step s+1 overlaps training of step s; 0 is strictly on-policy. Each phase is a module of ``rlgen.runtime.step``.

A stop request, or an engine that dies too often, ends the loop with a checkpoint (RunStopped); so does a learner
rank that dies or hangs, from a surviving rank where it can (rlgen.runtime.durability.learner_loss)."""

from __future__ import annotations

import time

from rlgen.metrics.balance import BalanceTracker
from rlgen.metrics.balance_context import context_from_plan
from rlgen.metrics.sink import MetricsSink
from rlgen.runtime.cluster.waits import LearnerLost
from rlgen.runtime.durability.checkpoint import save, stopped
from rlgen.runtime.durability.final_checkpoint import save_final
from rlgen.runtime.durability.learner_loss import WeightUpdateHung, learner_lost, update_hung
from rlgen.runtime.errors import RunError, StopRequested
from rlgen.runtime.rollouts.engine_restarts import EngineLost
from rlgen.runtime.run_handle import Run
from rlgen.runtime.step.advantages import advantages
from rlgen.runtime.step.generate import generate, kept_for_resume
from rlgen.runtime.step.record import StepStart, evaluate, record
from rlgen.runtime.step.score import score
from rlgen.runtime.step.sync import finish_updates, sleep_engines, sync
from rlgen.runtime.step.train import train_batch
from rlgen.types import StepTimeline


def train(run: Run, sink: MetricsSink) -> dict:
    """Run steps state.step .. steps-1, checkpointing every checkpoint.every steps and at the end (where the disk
    has no room left for the last checkpoint, keeping the trained weights alone); returns the sink's summary."""
    services = run.services
    cfg, state = run.cfg, run.state
    services.sink = sink
    tracker = BalanceTracker(context_from_plan(run.plan))
    for rec in sink.records:  # a resumed run: the verdict carries on from the steps already run
        tracker.update(rec)
    try:
        for step in range(state.step, cfg.steps):
            if services.stop.requested:
                raise StopRequested(f"step {step}")
            halt = _step(run, step, tracker)
            if halt is not None:
                raise RunError(halt)
            every = cfg.checkpoint.every
            if every > 0 and state.step % every == 0 and state.step < cfg.steps:
                save(run, "every", background=bool(cfg.checkpoint.background))
        finish_updates(run)
        save_final(run)  # or, where the disk has no room left for a checkpoint, the trained weights alone
    except StopRequested:
        raise stopped(run, services.stop.name, services.stop.exit_code, write=True) from None
    except EngineLost as err:
        raise stopped(run, str(err), 1, write=True) from err
    except LearnerLost as err:
        raise learner_lost(run, err) from err
    except WeightUpdateHung as err:
        raise update_hung(run, err) from err
    return sink.summary()


def _step(run: Run, step: int, tracker: BalanceTracker) -> str | None:
    """One step, phase by phase (each in its module of rlgen.runtime.step); returns the breaker's halt message when
    it halts the run."""
    at = StepStart(step, time.time(), StepTimeline(step))
    generated = generate(run, step, at.tl)  # the step's flight, collected; those ahead of it launched
    run.learners_ready()  # the first batch may have generated while the learners started
    scored = score(run, step, generated, at.tl)  # rewards, shaped and refilled; the batch's rows
    sleep_engines(run, at.tl)  # colocated engines sleep while the learners work
    with kept_for_resume(run.built.rollouts, generated.flight):  # a learner lost: the step runs again on resume
        batch = advantages(run, step, scored, at.tl)  # once, over the whole batch (a teacher's terms per token)
        trained = train_batch(run, step, batch, at.tl)  # the learner group's optimizer step
    synced = sync(run, step, trained, batch, at.tl)  # the breaker; the new version to the engines (or they wake)
    evals = evaluate(run, step)  # the held-out prompts, on evaluation steps
    record(run, at, scored, batch, trained, synced, evals, tracker)  # metrics.jsonl, with the balance verdict
    return synced.halt


__all__ = ["train"]
