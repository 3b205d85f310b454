"""A learner rank lost while the run runs: it died, or hung in a collective (runtime.hang_timeout_s). The lost
ranks' actors are killed, and the run stops with a checkpoint of the last whole step written by a surviving rank
where the ranks are replicas that hold that step with equal RNG states; else at the last complete checkpoint.
One sentence says what happened, which checkpoint the run continues from, and how (resume=auto)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlgen.runtime.cluster.waits import LearnerLost
from rlgen.runtime.durability.checkpoint import save, stopped
from rlgen.runtime.durability.disk_space import DiskFull
from rlgen.runtime.errors import RunError, RunStopped, StopRequested

if TYPE_CHECKING:
    from rlgen.runtime.run_handle import Run

log = logging.getLogger(__name__)
MARGIN_S = 30.0  # on top of hang_timeout_s: a survivor still leaving a collective answers within this


def learner_lost(run: Run, err: LearnerLost) -> RunStopped:
    """The run's end after err (run: a runtime.setup.Run): a checkpoint of the last whole step from a surviving
    rank where one can be had, else the newest complete checkpoint, said plainly."""
    _kill(run, err.ranks)
    survivors = [r for r in range(len(run.built.learners)) if r not in err.ranks]
    why_not = stand_in_problem(run, err.ranks, survivors)
    if why_not is None:
        stand_ins = {lost: survivors[0] for lost in err.ranks}
        try:
            path = save(run, f"stop: {err}", stand_ins=stand_ins)
        except (RunError, DiskFull, OSError, StopRequested) as exc:
            log.info("the stand-in checkpoint was not written", exc_info=exc)
            why_not = f"writing it from learner rank {survivors[0]} failed ({exc})"
        else:
            return RunStopped(f"{err}; the run stopped with a checkpoint of the last whole step, {path.name}, "
                              f"written by learner rank {survivors[0]} in place of the lost rank's files. "
                              "Continue it with resume=auto.", exit_code=1, step=run.state.step, checkpoint=str(path))
    end = stopped(run, str(err), 1, write=False)
    return RunStopped(fallback_sentence(str(err), why_not, end.checkpoint, run.state.step), exit_code=1,
                      step=end.step, checkpoint=end.checkpoint)


class WeightUpdateHung(RunError):
    """A weight update did not finish within runtime.hang_timeout_s."""


def update_hung(run: Run, err: WeightUpdateHung) -> RunStopped:
    """The run's end after a hung weight update: the learners hold a step the run has not recorded, so it
    continues from the newest complete checkpoint (the actors still in the update end with the run)."""
    end = stopped(run, str(err), 1, write=False)
    why = "the learners are past the step being recorded while the engines are not"
    return RunStopped(fallback_sentence(str(err), why, end.checkpoint, run.state.step), exit_code=1,
                      step=end.step, checkpoint=end.checkpoint)


def fallback_sentence(what: str, why_not: str, checkpoint: str | None, step: int) -> str:
    """The sentence when no checkpoint of the last whole step could be written."""
    if checkpoint is None:
        return f"{what}; no checkpoint of step {step} could be written ({why_not}) and none was written before, so " \
               "the run starts again from step 0 (run the same command without resume=)."
    name = checkpoint.rstrip("/").rsplit("/", 1)[-1]
    return f"{what}; no checkpoint of step {step} could be written ({why_not}), so the run continues from the last " \
           f"complete checkpoint, {name}, with resume=auto (the steps after it run again)."


def stand_in_problem(run: Run, lost: list[int], survivors: list[int]) -> str | None:
    """Why no surviving rank can write the lost ranks' files of the last whole step, or None when one can: the
    ranks are replicas, the survivors hold the step the run is at (no update of the failed step applied), and the
    lost ranks' RNG states at that step, recorded when it finished, equal the survivors'."""
    if not survivors:
        return "no learner rank survived to stand in for it"
    step = run.state.step
    refs = [run.built.learners[r].whole_step.remote() for r in survivors]
    try:
        held = run.services.waiter.get(refs, "asking the surviving learner ranks what they hold",
                                       run.cfg.runtime.hang_timeout_s + MARGIN_S, interruptible=False)
    except RunError as exc:
        return f"the surviving ranks did not answer ({exc})"
    if not all(h.get("replicas") for h in held):
        return "the ranks' files differ (each holds its own part of the optimizer state)"
    wrong = [r for r, h in zip(survivors, held) if (h["calls"], h["version"]) != (step, run.state.version)]
    if wrong:
        return f"learner rank {wrong[0]} holds {held[survivors.index(wrong[0])]['calls']} steps, not {step}"
    digests = {h["rng_digest"] for h in held} | {run.state.rank_rng.get(r, (None, None))[1] for r in lost}
    unknown = [r for r in lost if run.state.rank_rng.get(r, (None, None))[0] != step]
    if unknown:
        return f"learner rank {unknown[0]}'s RNG state after step {step - 1} is not known to this process"
    if len(digests) != 1:
        return "the lost rank's RNG state differs from the surviving ranks'"
    return None


def _kill(run: Run, ranks: list[int]) -> None:
    """The lost ranks' actors gone for good (a hung one would otherwise hold its process and GPU)."""
    import ray

    for r in ranks:
        try:
            ray.kill(run.built.learners[r], no_restart=True)
        except Exception as exc:  # noqa: BLE001 - already dead
            log.info("learner rank %d: %s", r, exc)


__all__ = ["WeightUpdateHung", "fallback_sentence", "learner_lost", "stand_in_problem", "update_hung"]
