"""A training run as a library call: plan -> set-up -> loop -> report, with status.json, run.log, the metrics
sink and the final model kept up to date whichever way it ends. ``rlgen train`` (commands/train.py) calls it;
tests call it directly."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from rlgen.config import ExistingRun
from rlgen.durable import disk_full
from rlgen.gpubusy import BusySampler
from rlgen.metrics.balance_context import context_from_plan
from rlgen.metrics.report import balance_summary, print_summary, write_report
from rlgen.metrics.sink import MetricsSink
from rlgen.plan import Plan
from rlgen.plan.view import memory_line, resolved_lines
from rlgen.runlog import MirroredConsole, attach_run_log
from rlgen.runtime.durability.checkpoint_folder import final_model_from, newest_checkpoint
from rlgen.runtime.durability.disk_space import DiskFull, check_run_fits
from rlgen.runtime.durability.resume import resume_clause
from rlgen.runtime.durability.run_folder import held_run, settle
from rlgen.runtime.durability.run_lock import acquire_run_lock, command_line
from rlgen.runtime.durability.status_file import RunStatus
from rlgen.runtime.errors import RunError, RunStopped, StopRequested, WriteStopped
from rlgen.runtime.loop import train
from rlgen.runtime.setup import (
    Hooks,
    Run,
    TakeOverFailed,
    say_cold_start,
    set_up,
    take_over_failed,
    tear_down,
)
from rlgen.runtime.signals import StopFlag
from rlgen.runtime.start.progress import print_startup

if TYPE_CHECKING:
    from rlgen.runtime.durability.resume import ResumePoint
    from rlgen.types import JSONValue

log = logging.getLogger(__name__)


def run_training(
    plan: Plan,
    out_dir: Path,
    console: Console | None = None,
    *,
    resume: ResumePoint | None = None,
    stop: StopFlag | None = None,
    resume_command: str | None = None,
    engine_cls: type | None = None,
    engine_kwargs: dict[str, object] | None = None,
    learner_cls: type | None = None,
) -> dict:
    """Train the plan's steps in out_dir (continuing `resume`, a ResumePoint, when given) and return the
    summary. Raises DiskTooSmall before anything starts when the disks cannot hold what the run will write,
    RunStopped after a clean stop (a checkpoint was written where possible), RunError when the run cannot go on.
    status.json and run.log in out_dir say what happened either way. engine_cls (with engine_kwargs) and
    learner_cls replace the plan's actor classes (tests inject faults with them)."""
    console = console or MirroredConsole()
    stop = stop or StopFlag()
    out_dir = Path(out_dir)
    # a folder that holds another run is never written over: refused, left for a folder of its own, or (replace)
    # cleared once this run holds its lock
    held = None if resume is not None else held_run(out_dir)
    replace = held is not None and plan.config.existing_run is ExistingRun.replace
    if held is not None and not replace:
        out_dir, said = settle(out_dir, plan.config.existing_run)
        console.print(f"[yellow]note:[/] {escape(said)}", highlight=False)
    # every write the run will make must fit, before it writes anything: refused in a sentence (DiskTooSmall)
    check_run_fits(plan, out_dir, resume, resume_command)
    out_dir.mkdir(parents=True, exist_ok=True)
    # one run per run directory: a second one (resume=auto while the first still runs) is refused in a sentence
    lock = acquire_run_lock(out_dir, command_line())
    if lock.stale:
        log.info("%s", lock.stale)
    if replace:
        _, said = settle(out_dir, ExistingRun.replace, keep=(".hydra",))  # Hydra's files are this run's
        console.print(f"[yellow]note:[/] {escape(said)}", highlight=False)
    try:
        return _locked_run(plan, out_dir, console, stop, resume, resume_command,
                           Hooks(engine_cls, dict(engine_kwargs or {}), learner_cls))
    finally:
        lock.release()


def _locked_run(plan: Plan, out_dir: Path, console: Console, stop: StopFlag, resume: ResumePoint | None,
                resume_command: str | None, hooks: Hooks) -> dict:
    detach = attach_run_log(out_dir)
    _print_resolved(plan, console)
    status = RunStatus(out_dir, steps=plan.config.steps, step=resume.step if resume else 0,
                       resume_command=resume_command, resumed_from=str(resume.checkpoint) if resume else None)
    status.update(state="starting")
    if resume is None:
        (out_dir / "plan.json").write_text(plan.to_json() + "\n")
    else:
        _note_resume(out_dir, resume, console)
    stop.on_second = lambda signum: status.update_before_exit(state="stopped",
                                                                reason=f"killed by a second {stop.name}")
    run: Run | None = None
    finished = False
    try:
        for cold in (False, True):  # a run that cannot start on a kept cluster it took over starts again cold
            try:
                run = set_up(plan, out_dir, resume=resume, stop=stop, console=console, status=status, hooks=hooks)
                status.update(state="running")
                summary = _train_and_report(run)
                break
            except Exception as err:
                if cold or not take_over_failed(run, err):
                    raise err.err if isinstance(err, TakeOverFailed) else err  # noqa: B904 - err goes on as it is
                if run is not None:
                    tear_down(run)  # takes the cluster it took over down whole
                    run = None
                say_cold_start(err)
                status.update(state="starting")
        status.update(state="finished", step=plan.config.steps, checkpoint=summary["checkpoint_path"], reason=None,
                      **({"note": summary["note"]} if "note" in summary else {}))
        finished = True
        return summary
    except BaseException as err:
        ended = _ended(err, out_dir, status, stop, run.state.step if run else (resume.step if resume else 0),
                       started=run is not None and run.services.sink is not None, resume_command=resume_command)
        if ended is err:
            raise
        raise ended from None
    finally:
        if run is not None:
            tear_down(run, keep=finished and not stop.requested)
        detach()


def _train_and_report(run: Run) -> dict:
    """The loop, then the summary, the report PNGs and the last lines on the terminal."""
    services = run.services
    built = run.built

    plan, console, state = run.plan, services.console, run.state
    sink = MetricsSink(run.out_dir, plan.config, plan.config.steps, console,
                       resume_lines=int(built.resume.state["metrics_lines"]) if built.resume else None,
                       wall_before=state.wall_before)

    def on_first() -> None:  # recorded at once: a process killed while stopping still says why
        services.status.update(state="stopped", reason=f"{services.stop.name}; stopping at the next safe point")
        sink.progress.update(sink.task_id, description="stopping")

    services.stop.on_first = on_first
    busy = _busy_sampler(plan)
    try:
        summary = train(run, sink)
        final = state.weights_only or final_model_from(state.last_checkpoint, run.out_dir)
        if plan.config.learner.lora.enabled and plan.config.learner.lora.save_merged:
            summary["merged_model_path"] = _save_merged(run, final)
        last = state.last_checkpoint
        summary.update(model_path=str(final), initial_model_path=built.initial_model_path,
                       checkpoint_path=str(last) if last is not None else None,
                       checkpoint_seconds=list(state.checkpoint_seconds), **services.startup)
        if state.weights_only is not None:
            summary["note"] = state.weights_only_note
        if services.clock is not None:
            summary["startup"] = services.clock.to_dict()
        if busy is not None:
            summary["gpu_busy_pct"] = busy.stop()
    finally:
        sink.progress.stop()
        if busy is not None:
            busy.close()
    ctx = context_from_plan(plan)
    if plan.layout_advice:
        summary["layout_advice"] = plan.layout_advice
    summary.update({f"balance_{k}": v for k, v in balance_summary(sink.records, ctx).items()})
    sink.close(summary)
    try:
        write_report(run.out_dir, sink.records, ctx)
    except Exception as err:  # noqa: BLE001 - a plotting problem must not fail a finished run
        console.print(f"[yellow]report not written:[/] {escape(str(err))}")
    print_summary(sink.records, ctx, console)
    if plan.layout_advice:  # another layout of this hardware is predicted faster (plan.layouts)
        console.print(f"[yellow]layout:[/] {escape(plan.layout_advice)}", highlight=False)
    if "startup" in summary:
        print_startup(summary["startup"], console)
    _print_first_rollout(services.startup, console)
    if "note" in summary:  # the run kept its weights but not a whole checkpoint: said last, where it is seen
        log.warning("%s", summary["note"])
        console.print(f"[yellow]note:[/] {escape(summary['note'])}", highlight=False)
    return summary


def _save_merged(run: Run, final: Path) -> str:
    """final_model/merged: the base with the final adapters merged in, a whole Hugging Face folder (LoRA with
    learner.lora.save_merged=true), written by learner rank 0 with the tokenizer beside it."""
    path = final / "merged"
    run.services.waiter.get([run.built.learners[0].save_merged.remote(str(path))], "writing final_model/merged",
                            run.cfg.timeout_s, names=["learner0"])
    run.built.tokenizer.save_pretrained(str(path))
    return str(path)


def _busy_sampler(plan: Plan) -> BusySampler | None:
    """On a GPU run whose driver sits on a GPU node: nvidia-smi's busy % over the loop of this node's GPUs that
    the run was given (CUDA_VISIBLE_DEVICES; summary gpu_busy_pct; None where nvidia-smi cannot be run). None on
    CPU."""
    if plan.device != "cuda":
        return None

    busy = BusySampler()
    busy.start()
    return busy


def _ended(err: BaseException, out_dir: Path, status: RunStatus, stop: StopFlag, step: int, *,
           started: bool = False, resume_command: str | None = None) -> BaseException:
    """status.json for a run that did not finish, and the error to raise: a stop the loop did not turn into a
    clean stop (during start-up, or while its last checkpoint was being made) becomes RunStopped with the newest
    checkpoint; a write that failed (a full disk behind any error, a checkpoint or a metrics line not written) a
    RunError saying what and the command that resumes the run; anything else goes on as it is."""
    if isinstance(err, StopRequested):
        ckpt = newest_checkpoint(out_dir)
        when = "while the run was stopping" if started else "during start-up"
        err = RunStopped(f"{stop.name} {when}", exit_code=stop.exit_code, step=step,
                         checkpoint=str(ckpt) if ckpt else None)
    if isinstance(err, RunStopped):
        _say_ended(status, state="stopped", reason=str(err), step=err.step, checkpoint=err.checkpoint,
                   exit_code=err.exit_code)
        return err
    log.info("the run failed", exc_info=err)
    full = disk_full(err)
    if full is not None or isinstance(err, (DiskFull, WriteStopped)):  # what was not written, then how to resume
        err = RunError(_write_stop_sentence(err, full, out_dir, resume_command))
    ckpt = newest_checkpoint(out_dir)
    reason = str(err) if isinstance(err, RunError) else f"{type(err).__name__}: {err}"
    _say_ended(status, state="failed", reason=reason, step=step, checkpoint=str(ckpt) if ckpt else None)
    return err


def _say_ended(status: RunStatus, **fields: JSONValue) -> None:
    """status.json's last update; a failure to write it is logged and never hides why the run ended."""
    try:
        status.update(**fields)
    except OSError as err:
        log.warning("%s could not be updated (%s); the run ended as %s: %s", status.path, err, fields["state"],
                    fields["reason"])


def _write_stop_sentence(err: BaseException, full: OSError | None, out_dir: Path, resume_command: str | None) -> str:
    """One sentence for a run stopped by a write: what was not written and the fix (the error's own, or, for a
    full disk behind another error, the folder's), then the command that resumes it."""
    if isinstance(err, (RunError, DiskFull)) or full is None:
        what = str(err).strip().rstrip(".")
    else:
        path = getattr(full, "path", None) or full.filename
        name = f"{Path(path).name} could not be written" if path else "a file could not be written"
        what = f"the disk that holds {out_dir} is full ({name}); free space on it (df -h {out_dir} shows what is left)"
    return f"{what}; {resume_clause(out_dir, resume_command)}."


def _print_first_rollout(startup: dict[str, float], console: Console) -> None:
    if "first_rollout_s" not in startup:
        return
    warm = startup.get("sync_warmup_s", 0.0)
    console.print(f"time to first rollout: {startup['first_rollout_s']:.1f} s (set-up {startup.get('setup_s', 0):.1f} s"
                  + (f", of which the first weight push {warm:.2f} s)" if warm else ")"), highlight=False)


def _print_resolved(plan: Plan, console: Console) -> None:
    """What the plan chose for the values the config left null, and the GPU memory split (logged too)."""

    lines = resolved_lines(plan)
    if lines:
        log.info("settings chosen by the plan:\n  %s", "\n  ".join(lines))
    line = memory_line(plan)
    if line:
        console.print(escape(line), highlight=False)


def _note_resume(out_dir: Path, point: ResumePoint, console: Console) -> None:
    """Say what is resumed and what changed, and keep a line of it in resumes.jsonl."""
    changed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in point.changes.items())
    console.print(
        f"resuming {out_dir} at step {point.step} from {point.checkpoint.name}"
        + (f" (changed: {changed})" if changed else ""),
        highlight=False,
    )
    if point.skipped_torn:
        console.print(f"skipped {len(point.skipped_torn)} torn checkpoint(s) without their COMPLETE marker: "
                      f"{', '.join(p.name for p in point.skipped_torn)}", highlight=False)
    with open(out_dir / "resumes.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "checkpoint": str(point.checkpoint), "step": point.step,
                            "changes": {k: list(v) for k, v in point.changes.items()}}, default=str) + "\n")


__all__ = ["run_training"]
