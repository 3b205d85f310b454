"""Checkpoint and restore, as functions of a Run and its RunState. The folder's format is
``rlgen.runtime.durability.checkpoint_folder``.

A checkpoint taken after k steps holds everything needed to run step k next, the rollouts generated ahead with
older weights included (those launched with the current weights are generated again, the same). The free space
is checked first, and a write that fails leaves the checkpoints already there as they were. With
``checkpoint.background`` the loop pays only the copy to host memory; one such write runs at a time.
docs/durability.md has the details.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlgen.durable import FULL
from rlgen.folder_bytes import unpack_into
from rlgen.learners.background import DONE, FAILED, marker
from rlgen.runtime.cluster.waits import POLL_S, LearnerLost
from rlgen.runtime.durability.background_write import BackgroundWrite
from rlgen.runtime.durability.checkpoint_folder import (
    CHECKPOINTS,
    begin_checkpoint,
    checkpoint_name,
    finish_checkpoint,
    is_complete,
    newest_checkpoint,
    read_rollouts,
    run_state,
)
from rlgen.runtime.durability.disk_space import DiskFull, check_free_space, folder_bytes
from rlgen.runtime.durability.resume import identity
from rlgen.runtime.errors import RunError, RunStopped, StopRequested, WriteStopped
from rlgen.runtime.rollouts.in_flight import InFlight

if TYPE_CHECKING:
    from rlgen.runtime.durability.resume import ResumePoint
    from rlgen.runtime.run_handle import Run
    from rlgen.types import JSONDict

log = logging.getLogger(__name__)


def save(run: Run, reason: str, *, background: bool = False, stand_ins: dict[int, int] | None = None) -> Path:
    """Write checkpoint step_<state.step> and return its path; with background (and learners that write into
    the run directory) return once the learners hold a copy of their state, while the checkpoint is completed in
    the background. stand_ins: {lost rank: surviving rank that writes its files}."""
    services = run.services
    built = run.built
    state = run.state
    path = run.out_dir / CHECKPOINTS / checkpoint_name(state.step)
    if is_complete(path) and state.last_checkpoint is not None and state.last_checkpoint.name == path.name:
        return path  # nothing has happened since that one was written
    finish_background(run)
    t0 = time.time()
    check_free_space(run.out_dir / CHECKPOINTS, expected_bytes(run), keep=run.cfg.checkpoint.keep,
                     small_bytes=run.plan.disk.small_bytes)
    kept = _ahead(run)
    saved = run_state(
        step=state.step, steps=run.cfg.steps, version=state.version, async_steps=state.async_steps,
        metrics_lines=len(services.sink.records) if services.sink else state.step,
        prompts_per_step=run.cfg.algo.prompts_per_step, ahead=[f.step for f in kept],
        restarts=built.keeper.total_restarts if built.keeper else 0, breaker=state.breaker.state_dict(),
        initial_model_path=built.initial_model_path,
        wall_s=state.wall_before + (time.time() - services.sink.t0 if services.sink else 0.0), reason=reason,
        identity=identity(run.cfg, len(built.learners)),
    )
    rollouts = {"flights": [f.to_json() for f in kept],
                "carry": built.rollouts.carry_to_save(kept) if built.rollouts else []}
    background = background and not stand_ins and all(built.folders.writes_here.get(n, True)
                                                      for n in built.folders.learner_nodes)
    tmp = _begin(run, state.step)
    try:
        _fill(run, tmp, background, stand_ins or {})
    except LearnerLost:  # the loop ends the run (rlgen.runtime.durability.learner_loss)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_failed(run, state.step, err) from err
    if background:
        job = BackgroundWrite(state.step, tmp, t0)
        job.thread = threading.Thread(target=_complete, args=(run, job, saved, rollouts), daemon=True,
                                      name=f"rlgen-checkpoint-{state.step}")
        run.state.background_write = job
        job.thread.start()
        _cost(run, t0, f"{reason}, completed in the background")
        return path
    final = _finish(run, state.step, tmp, saved, rollouts)
    _cost(run, t0, reason)
    return final


def _cost(run: Run, t0: float, what: str) -> None:
    seconds = time.time() - t0
    log.info("checkpoint step_%06d cost the loop %.2f s (%s)", run.state.step, seconds, what)
    run.state.checkpoint_seconds.append(seconds)


def _begin(run: Run, step: int) -> Path:
    try:
        return begin_checkpoint(run.out_dir, step)
    except OSError as err:
        raise write_failed(run, step, err) from err


def _finish(run: Run, step: int, tmp: Path, saved: JSONDict, rollouts: JSONDict) -> Path:
    """The state files and the marker in, renamed into place; the run state and status.json learn of it."""
    try:
        final = finish_checkpoint(run.out_dir, step, tmp, saved, rollouts, run.cfg.checkpoint.keep, _pinned(run))
    except OSError as err:
        raise write_failed(run, step, err) from err
    run.state.last_checkpoint = final
    if run.services.status is not None:
        run.services.status.update(checkpoint=str(final), step=step)
    return final


def _pinned(run: Run) -> list[Path]:
    """The checkpoint a resumed run started from, kept while it runs: an engine re-created after a fault loads
    its model folder (then takes the current weights), so pruning it would leave that engine nothing to start
    from. A later resume of the run lets it go."""
    built = run.built
    start = Path(built.start_model_path) if built.start_model_path else None
    return [start.parent] if start is not None and start.name == "model" and built.resume is not None else []


def _complete(run: Run, job: BackgroundWrite, saved: JSONDict, rollouts: JSONDict) -> None:
    """The background half of a checkpoint: wait for every rank's files, then finish it (on a thread)."""
    try:
        _wait_for_ranks(run, job)
        job.path = _finish(run, job.step, job.tmp, saved, rollouts)
        job.seconds = time.time() - job.started
        log.info("checkpoint %s written in the background in %.1f s", job.path, job.seconds)
    except BaseException as err:  # noqa: BLE001 - raised on the loop's thread by finish_background
        shutil.rmtree(job.tmp, ignore_errors=True)
        job.error = err


def _wait_for_ranks(run: Run, job: BackgroundWrite) -> None:
    """Every rank's done marker (then removed); a failed one, or none within timeout_s, raises."""
    timeout = run.cfg.timeout_s
    deadline = job.started + timeout
    pending = set(range(len(run.built.learners)))
    while pending:
        for rank in list(pending):
            failed = marker(job.tmp, rank, FAILED)
            if failed.is_file():
                why = json.loads(failed.read_text()).get("error", "an error")
                raise write_failed(run, job.step, OSError(why))
            done = marker(job.tmp, rank, DONE)
            if done.is_file():
                done.unlink()
                pending.discard(rank)
        if pending and time.time() > deadline:
            raise RunError(f"checkpoint step_{job.step:06d}: learner{min(pending)} did not finish writing its files "
                           f"within timeout_s={timeout:.0f} s; raise timeout_s or check the disk under {run.out_dir}.")
        if pending:
            time.sleep(POLL_S)


def finish_background(run: Run, timeout: float | None = None) -> None:
    """Wait for the checkpoint being written in the background, if any; its failure raises here (the
    checkpoints before it are untouched)."""
    job = run.state.background_write
    if job is None:
        return
    job.thread.join(timeout if timeout is not None else run.cfg.timeout_s + 30)
    if job.thread.is_alive():
        raise RunError(f"checkpoint step_{job.step:06d} is still being written after timeout_s; check the disk "
                       f"under {run.out_dir}.")
    run.state.background_write = None
    if job.error is not None:
        raise job.error


def expected_bytes(run: Run) -> int:
    """What the next checkpoint needs on disk: as much as the last one, or the plan's estimate for the first."""
    last = newest_checkpoint(run.out_dir)
    return folder_bytes(last) if last is not None else run.plan.disk.checkpoint_bytes


def write_failed(run: Run, step: int, err: BaseException) -> BaseException:
    """One sentence for a checkpoint that could not be written: where, why, that the last one is kept, and the
    fix (the run's end adds how to resume: WriteStopped)."""
    if isinstance(err, (RunError, DiskFull)) and "checkpoint step_" in str(err):
        return err
    last = newest_checkpoint(run.out_dir)
    kept = f"the newest complete checkpoint, {last.name}, is kept" if last else "no earlier checkpoint exists"
    text = str(getattr(err, "strerror", None) or err).strip()
    if getattr(err, "errno", None) in FULL or "No space left" in str(err):
        why, fix = "the disk is full", "free space on that disk"
    else:
        why, fix = (text.splitlines()[0] if text else type(err).__name__), "make that folder writable"
    return WriteStopped(f"checkpoint step_{step:06d} could not be written under {run.out_dir / CHECKPOINTS} ({why}); "
                        f"{kept}; {fix}.")


def _ahead(run: Run) -> list[InFlight]:
    """The flights generated ahead with weights older than the learner's: their results go in the checkpoint."""
    built = run.built
    kept: list[InFlight] = []
    for flight in built.rollouts.waiting() if built.rollouts else []:
        if flight.launch_version >= run.state.version:
            break  # this and every later flight can be regenerated exactly
        try:
            built.rollouts.collect(flight, interruptible=False)
        except RunError as err:  # an engine that cannot come back: regenerate these on resume
            log.info("rollouts of step %d are not kept in the checkpoint: %s", flight.step, err)
            break
        kept.append(flight)
    return kept


def _fill(run: Run, tmp: Path, background: bool, stand_ins: dict[int, int]) -> None:
    """The learners' files (or, background, their host copies) and the tokenizer into the checkpoint's
    temporary folder. A learner on a node that cannot see the run directory sends its files back packed. A lost
    rank's files are written by its stand-in (stand_ins), which must write into the run directory."""
    built = run.built

    here = [built.folders.writes_here.get(n, True) for n in built.folders.learner_nodes]
    ranks = [r for r in range(len(built.learners)) if r not in stand_ins]
    refs = []
    for r in ranks:
        a, ok = built.learners[r], here[r]
        if stand_ins and not ok:
            raise RunError(f"learner rank {r} cannot write into {run.out_dir}, so it cannot stand in for a lost rank")
        if stand_ins:
            refs.append(a.save_checkpoint_for.remote(str(tmp), [r, *sorted(d for d, s in stand_ins.items() if s == r)]))
        else:
            refs.append(a.save_checkpoint.remote(str(tmp), background) if ok else a.save_checkpoint_packed.remote())
    for r, out in zip(ranks, run.learner_group.wait(refs, "writing a checkpoint", hang=False, ranks=ranks)):
        if not here[r]:
            unpack_into(out, str(tmp))
    built.tokenizer.save_pretrained(str(tmp / "model"))  # a complete HF folder: the learner saves weights only


def stopped(run: Run, reason: str, exit_code: int, *, write: bool) -> RunStopped:
    """The clean end of a stopped run: a checkpoint where the learner is still whole, then RunStopped."""
    path = None
    if write and run.built.learners:
        try:
            path = save(run, f"stop: {reason}")
        except (RunError, DiskFull, OSError, StopRequested) as err:  # a second stop while an engine restarts
            log.info("no checkpoint at the stop", exc_info=err)
            reason = f"{reason}; the checkpoint at the stop could not be written ({err})"
    else:
        try:
            finish_background(run)
        except (RunError, OSError) as err:
            log.info("the background checkpoint did not complete", exc_info=err)
    path = path or newest_checkpoint(run.out_dir)
    return RunStopped(reason, exit_code=exit_code, step=run.state.step, checkpoint=str(path) if path else None)


def restore_rollouts(run: Run, point: ResumePoint) -> None:
    """The rollouts a checkpoint kept (generated ahead of the learner), back in flight; the run state itself was
    read when the run was set up (RunState.resumed)."""
    saved = read_rollouts(point.checkpoint)
    run.built.rollouts.restore(saved["flights"], run.state.step, saved.get("carry", []))


__all__ = ["expected_bytes", "finish_background", "restore_rollouts", "save", "stopped", "write_failed"]
