"""Record: the step's held-out evaluation (every eval.every steps and the last), then its line of metrics.jsonl
(rlgen.runtime.step.line) with the balance verdict, written by the sink; the run's step count moves on."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rlgen.metrics.balance import BalanceTracker
from rlgen.runtime.errors import WriteStopped
from rlgen.runtime.run_handle import Run
from rlgen.runtime.step.advantages import Batch
from rlgen.runtime.step.line import step_record
from rlgen.runtime.step.score import Scored
from rlgen.runtime.step.sync import Synced
from rlgen.runtime.step.train import Trained
from rlgen.types import StepTimeline


@dataclass
class StepStart:
    """A step as it began: its index, wall clock and timeline."""

    step: int
    began: float
    tl: StepTimeline


def evaluate(run: Run, step: int) -> dict[str, float]:
    """eval/* of the held-out prompts on evaluation steps (with the engines at the new version), else {}."""
    cfg, ro = run.cfg, run.built.rollouts
    if ro.eval_set and ((step + 1) % cfg.eval.every == 0 or step + 1 == cfg.steps):
        return ro.evaluate(step, run.built.transport.version)
    return {}


def record(run: Run, at: StepStart, scored: Scored, batch: Batch, trained: Trained, synced: Synced,
           evals: dict[str, float], tracker: BalanceTracker) -> None:
    """The step's record, with the balance verdict (its advice is said once, at the end of the run), to the sink;
    a line that could not be written stops the run (WriteStopped)."""
    state = run.state
    metrics = {**trained.metrics, **scored.metrics, **synced.metrics,
               "engine_restarts": run.built.keeper.total_restarts, **evals}
    rec = step_record(at.step, at.tl, batch.rows, scored.scores.totals, metrics, state.version, batch.staleness,
                      time.time() - at.began, len(run.built.learners))
    verdict = tracker.update(rec)
    rec["balance"] = verdict.to_dict()
    state.step = at.step + 1
    try:
        run.services.sink.log(rec)
    except OSError as err:  # the line was not written (the file keeps its whole lines): say why, stop
        raise WriteStopped(str(err)) from err


__all__ = ["StepStart", "evaluate", "record"]
