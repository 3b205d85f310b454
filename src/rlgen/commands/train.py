"""`rlgen train`: a composed config -> plan -> actors -> a GRPO run that survives stops and faults.

``run_training`` is the run as a library call (tests use it); ``train_app`` is the Hydra task that resolves
``resume=``, takes SIGINT/SIGTERM, and turns every way a run can end into one line and an exit code.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rlgen.config import RunConfig, to_run_config
from rlgen.plan import PlanError, build_plan
from rlgen.runlog import LOG_FILE, MirroredConsole, attach_run_log

log = logging.getLogger(__name__)


def run_dir() -> Path:
    """Hydra's output directory for this job (cwd when called outside a Hydra app)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path.cwd()


def run_training(
    cfg: RunConfig,
    out_dir: Path,
    console: Console | None = None,
    *,
    resume: Any = None,
    stop: Any = None,
    resume_command: str | None = None,
    **orchestrator_kwargs: Any,
) -> dict:
    """Train cfg.steps steps in out_dir (continuing `resume`, a ResumePoint, when given) and return the
    summary. Raises RunStopped after a clean stop (a checkpoint was written where possible), RunError when the
    run cannot go on. status.json and run.log in out_dir say what happened either way."""
    from rlgen.metrics.balance import context_from_plan
    from rlgen.metrics.report import balance_summary, print_summary, write_report
    from rlgen.metrics.sink import MetricsSink
    from rlgen.runtime import Orchestrator, RunError, RunStopped, StopRequested
    from rlgen.runtime.checkpoint import newest_checkpoint
    from rlgen.runtime.status import RunStatus
    from rlgen.runtime.stop import StopFlag

    console = console or MirroredConsole()
    stop = stop or StopFlag()
    plan = build_plan(cfg)
    cfg = plan.apply(cfg)  # the values the config left null, as the plan resolved them
    _print_resolved(plan, console)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    detach = attach_run_log(out_dir)
    status = RunStatus(out_dir, steps=cfg.steps, step=resume.step if resume else 0, resume_command=resume_command,
                       resumed_from=str(resume.checkpoint) if resume else None)
    status.update(state="starting")
    if resume is None:
        (out_dir / "plan.json").write_text(plan.to_json() + "\n")
    else:
        _note_resume(out_dir, resume, console)
    stop.on_second = lambda signum: status.update(state="stopped", reason=f"killed by a second {stop.name}")
    orch = Orchestrator(cfg, plan, out_dir, resume=resume, stop=stop, console=console, status=status,
                        **orchestrator_kwargs)
    try:
        orch.setup()
        status.update(state="running")
        sink = MetricsSink(out_dir, cfg, cfg.steps, console,
                           resume_lines=int(resume.state["metrics_lines"]) if resume else None,
                           wall_before=orch.wall_before)

        def on_first() -> None:  # recorded at once: a process killed while stopping still says why
            status.update(state="stopped", reason=f"{stop.name}; stopping at the next safe point")
            sink.progress.update(sink.task_id, description="stopping")

        stop.on_first = on_first
        try:
            summary = orch.train(sink)
            summary["model_path"] = str(orch.final_model())
            summary["initial_model_path"] = orch.initial_model_path
            summary["checkpoint_path"] = str(orch.last_checkpoint)
            summary["checkpoint_seconds"] = list(orch.checkpoint_seconds)
            summary.update(orch.startup)
        finally:
            sink.progress.stop()
        ctx = context_from_plan(plan)
        summary.update({f"balance_{k}": v for k, v in balance_summary(sink.records, ctx).items()})
        sink.close(summary)
        try:
            write_report(out_dir, sink.records, ctx)
        except Exception as err:  # noqa: BLE001 - a plotting problem must not fail a finished run
            console.print(f"[yellow]report not written:[/] {escape(str(err))}")
        print_summary(sink.records, ctx, console)
        if "first_rollout_s" in orch.startup:
            st = orch.startup
            warm = st.get("sync_warmup_s", 0.0)
            console.print(f"time to first rollout: {st['first_rollout_s']:.1f} s (set-up {st.get('setup_s', 0):.1f} s"
                          + (f", of which the first weight push {warm:.2f} s)" if warm else ")"), highlight=False)
        status.update(state="finished", step=cfg.steps, checkpoint=summary["checkpoint_path"], reason=None)
        return summary
    except StopRequested:  # before the first step: nothing new to keep
        ckpt = newest_checkpoint(out_dir)
        err = RunStopped(f"{stop.name} during start-up", exit_code=stop.exit_code, step=orch.next_step,
                         checkpoint=str(ckpt) if ckpt else None)
        status.update(state="stopped", reason=str(err), step=err.step, checkpoint=err.checkpoint, exit_code=err.exit_code)
        raise err from None
    except RunStopped as err:
        status.update(state="stopped", reason=str(err), step=err.step, checkpoint=err.checkpoint, exit_code=err.exit_code)
        raise
    except BaseException as err:
        log.info("the run failed", exc_info=err)
        ckpt = newest_checkpoint(out_dir)
        reason = str(err) if isinstance(err, RunError) else f"{type(err).__name__}: {err}"
        status.update(state="failed", reason=reason, step=orch.next_step, checkpoint=str(ckpt) if ckpt else None)
        raise
    finally:
        orch.cleanup()
        detach()


def _note_resume(out_dir: Path, point: Any, console: Console) -> None:
    """Say what is resumed and what changed, and keep a line of it in resumes.jsonl."""
    import time

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


# -- the Hydra task -------------------------------------------------------------------------------------------
def _in_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except (ImportError, ValueError):
        return False


def _job_failed(status: str, message: str, prefix: str, code: int, out: Path | None = None, *,
                end_sweep: bool = False) -> float:
    """Report a job that could not run or stopped. A single run exits with `code`; a job of a multirun writes
    its reason to status.json (the sweep summary shows it) and returns NaN, so the sweep goes on, unless
    end_sweep (a stop signal: the user wants the whole sweep to stop)."""
    from rlgen.runtime.status import RunStatus, read_status

    Console(stderr=True, soft_wrap=True).print(prefix + escape(message), highlight=False)
    if end_sweep or not _in_multirun():
        sys.exit(code)
    out = out or run_dir()
    if (read_status(out) or {}).get("state") not in ("stopped", "failed"):
        RunStatus(out).update(state=status, reason=message)
    return float("nan")


def _resume_command(resume_to: Path) -> str:
    """The command that continues this run: the overrides it was started with, and resume=<its directory>."""
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
    except ValueError:
        overrides = []
    return " ".join(["rlgen", "train", *map(shlex.quote, overrides), shlex.quote(f"resume={_shown(resume_to)}")])


def _print_resolved(plan: Any, console: Console) -> None:
    """What the plan chose for the values the config left null, and the GPU memory split (logged too)."""
    from rlgen.plan.view import memory_line, resolved_lines

    lines = resolved_lines(plan)
    if lines:
        log.info("settings chosen by the plan:\n  %s", "\n  ".join(lines))
    line = memory_line(plan)
    if line:
        console.print(escape(line), highlight=False)


def _shown(path: str | Path) -> str:
    """A path as a user would type it here: relative below the current directory, else absolute."""
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else str(Path(path).resolve())


def _resolve_resume(cfg: RunConfig, out: Path, console: Console) -> Any:
    """The ResumePoint for cfg.resume (None: start a new run). Raises ResumeError when it cannot be honoured."""
    from rlgen.plan import build_plan
    from rlgen.runtime.resume import identity, resolve_auto, resolve_explicit, search_root_from_hydra

    plan = build_plan(cfg)
    current = identity(plan.apply(cfg), len(plan.learners))
    if cfg.resume == "auto":
        point, note = resolve_auto(out, search_root_from_hydra(), current)
        if note:
            console.print(note, highlight=False)
        return point
    return resolve_explicit(cfg.resume, current)


def _move_into(point: Any, hydra_dir: Path) -> None:
    """A resume continues in the run's own directory; the fresh directory Hydra made for this call goes (a
    multirun job's stays, pointing at the run it continued, for the sweep summary)."""
    if hydra_dir.resolve() == point.run_dir.resolve():
        return
    if _in_multirun():
        (hydra_dir / "resumed_into").write_text(str(point.run_dir.resolve()) + "\n")
        return
    if {p.name for p in hydra_dir.iterdir()} <= {".hydra", LOG_FILE}:
        shutil.rmtree(hydra_dir, ignore_errors=True)


def _preflight(cfg: RunConfig, out: Path) -> None:
    """The validation pass, unless the command line already ran it on this config (a sweep point it refused
    is rejected here, and its job records why)."""
    from rlgen.commands.checks import CHECKED, config_key
    from rlgen.plan.preflight import preflight

    if config_key(cfg) in CHECKED:
        return
    problems = preflight(cfg, run_dir=out).blocking()
    if problems:
        raise PlanError(problems)


def train_app(dict_cfg) -> float:
    """Hydra entry point. Returns the last-20% mean reward, so sweeps have an objective."""
    from rlgen.runtime import RunError, RunStopped
    from rlgen.runtime.resume import ResumeError
    from rlgen.runtime.stop import StopFlag

    console = MirroredConsole()
    stop = StopFlag()
    stop.install()
    out = run_dir()
    steps = dict_cfg.get("steps")
    try:
        cfg = to_run_config(dict_cfg)
        _preflight(cfg, out)
        point = _resolve_resume(cfg, out, console) if cfg.resume else None
        if point is not None:
            _move_into(point, out)
            out = point.run_dir
            if point.step >= cfg.steps:
                console.print(f"{out} already finished its {point.step} steps; raise steps= to train it further, "
                              "or drop resume= to start a new run.", highlight=False)
                return float("nan")
        summary = run_training(cfg, out, console, resume=point, stop=stop, resume_command=_resume_command(out))
    except PlanError as err:
        return _job_failed("rejected", "\n".join(err.problems), "[bold red]error:[/] ", 2)
    except ResumeError as err:
        return _job_failed("rejected", str(err), "[bold red]error:[/] ", 2)
    except RunStopped as err:
        where = f"; checkpoint {_shown(err.checkpoint)}" if err.checkpoint else "; no checkpoint yet"
        how = f"; resume with: {_resume_command(out)}" if err.checkpoint else ""
        return _job_failed("stopped", f"stopped at step {err.step} of {steps} ({err}){where}{how}", "", err.exit_code, out,
                           end_sweep=stop.requested)
    except RunError as err:
        return _job_failed("failed", f"{err} (details: {out / LOG_FILE})", "[bold red]run stopped:[/] ", 1, out)
    except Exception as err:  # noqa: BLE001 - one line here, the traceback in run.log (run_training wrote it)
        log.info("the run failed", exc_info=err)
        return _job_failed("failed", f"unexpected {type(err).__name__}: {err} (details: {out / LOG_FILE})",
                           "[bold red]run stopped:[/] ", 1, out)
    finally:
        stop.uninstall()
    console.print(json.dumps({k: summary[k] for k in ("reward_first_20pct", "reward_last_20pct")}), highlight=False)
    return float(summary["reward_last_20pct"])
