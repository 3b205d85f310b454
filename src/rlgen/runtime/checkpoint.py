"""Checkpoint and restore, as functions of a Run and its RunState. The folder's format (what each file holds,
the COMPLETE marker, rotation, the driver's RNG) is ``rlgen.runtime.checkpoint_dir``.

A checkpoint taken after k steps holds everything needed to run step k next: the learners' state, the policy
and its tokenizer, the run state, and the rollouts generated ahead of the learner with older weights. Rollouts
launched with the current weights are not kept: the resumed run generates them again with the same seeds, and
gets the same ones."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rlgen.runtime.checkpoint_dir import (
    CHECKPOINTS,
    checkpoint_name,
    is_complete,
    newest_checkpoint,
    read_rollouts,
    run_state,
    write_checkpoint,
)
from rlgen.runtime.errors import RunError, RunStopped
from rlgen.runtime.flights import InFlight
from rlgen.runtime.resume import identity

log = logging.getLogger(__name__)


def save(run: Any, reason: str) -> Path:
    """Write checkpoint step_<state.step> (run: a runtime.setup.Run) and return its path."""
    state = run.state
    path = run.out_dir / CHECKPOINTS / checkpoint_name(state.step)
    if is_complete(path) and state.last_checkpoint is not None and state.last_checkpoint.name == path.name:
        return path  # nothing has happened since that one was written
    t0 = time.time()
    kept = _ahead(run)
    saved = run_state(
        step=state.step, steps=run.cfg.steps, version=state.version, async_steps=state.async_steps,
        metrics_lines=len(run.sink.records) if run.sink else state.step,
        prompts_per_step=run.cfg.algo.prompts_per_step, ahead=[f.step for f in kept],
        restarts=run.keeper.total_restarts if run.keeper else 0, breaker=state.breaker.state_dict(),
        initial_model_path=run.initial_model_path,
        wall_s=state.wall_before + (time.time() - run.sink.t0 if run.sink else 0.0), reason=reason,
        identity=identity(run.cfg, len(run.learners)),
    )
    path = write_checkpoint(run.out_dir, state.step, lambda tmp: _fill(run, tmp), saved,
                            {"flights": [f.to_json() for f in kept]}, run.cfg.checkpoint.keep)
    state.last_checkpoint = path
    seconds = time.time() - t0
    log.info("checkpoint %s written in %.2f s (%s)", path, seconds, reason)
    state.checkpoint_seconds.append(seconds)
    if run.status is not None:
        run.status.update(checkpoint=str(path), step=state.step)
    return path


def _ahead(run: Any) -> list[InFlight]:
    """The flights generated ahead with weights older than the learner's: their results go in the checkpoint."""
    kept: list[InFlight] = []
    for flight in run.rollouts.pending if run.rollouts else []:
        if flight.launch_version >= run.state.version:
            break  # this and every later flight can be regenerated exactly
        try:
            run.rollouts.collect(flight, interruptible=False)
        except RunError as err:  # an engine that cannot come back: regenerate these on resume
            log.info("rollouts of step %d are not kept in the checkpoint: %s", flight.step, err)
            break
        kept.append(flight)
    return kept


def _fill(run: Any, tmp: Path) -> None:
    """The learners' files and the tokenizer into the checkpoint's temporary folder. A learner on a node that
    cannot see the run directory sends its files back packed."""
    from rlgen.packing import unpack_into

    here = [run.folders.writes_here.get(n, True) for n in run.folders.learner_nodes]
    refs = [a.save_checkpoint.remote(str(tmp)) if ok else a.save_checkpoint_packed.remote()
            for a, ok in zip(run.learners, here)]
    names = [f"learner{r}" for r in range(len(run.learners))]
    for ok, out in zip(here, run.waiter.learner_get(refs, "writing a checkpoint", names, run.folders.learner_nodes)):
        if not ok:
            unpack_into(out, str(tmp))
    run.tokenizer.save_pretrained(str(tmp / "model"))  # a complete HF folder: the learner saves weights only


def stopped(run: Any, reason: str, exit_code: int, *, write: bool) -> RunStopped:
    """The clean end of a stopped run: a checkpoint where the learner is still whole, then RunStopped."""
    path = None
    if write and run.learners:
        try:
            path = save(run, f"stop: {reason}")
        except (RunError, OSError) as err:
            log.info("no checkpoint at the stop", exc_info=err)
            reason = f"{reason}; the checkpoint at the stop could not be written ({err})"
    path = path or newest_checkpoint(run.out_dir)
    return RunStopped(reason, exit_code=exit_code, step=run.state.step, checkpoint=str(path) if path else None)


def restore_rollouts(run: Any, point: Any) -> None:
    """The rollouts a checkpoint kept (generated ahead of the learner), back in flight; the run state itself was
    read when the run was set up (RunState.resumed)."""
    run.rollouts.restore(read_rollouts(point.checkpoint)["flights"], run.state.step)


__all__ = ["restore_rollouts", "save", "stopped"]
