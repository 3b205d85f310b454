"""`rlgen train`: the Hydra task. It takes the plan the command line built (or builds it, once), resolves
``resume=``, takes SIGINT/SIGTERM, runs ``rlgen.runtime.run.run_training``, and turns every way a run can end
into one line and an exit code."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rlgen import run_launched
from rlgen.commands.checks import planned
from rlgen.config import RunConfig, to_run_config
from rlgen.errors import UserError
from rlgen.plan import PlanError
from rlgen.plan.preflight import preflight
from rlgen.runlog import LOG_FILE, MirroredConsole
from rlgen.runtime import RunError, RunStopped
from rlgen.runtime.durability.resume import (
    ResumeError,
    identity,
    resolve_auto,
    resolve_explicit,
    search_root_from_hydra,
)
from rlgen.runtime.durability.run_folder import RunDirHeld
from rlgen.runtime.durability.run_lock import release_claim
from rlgen.runtime.durability.status_file import RunStatus, read_status
from rlgen.runtime.run import run_training
from rlgen.runtime.signals import StopFlag

log = logging.getLogger(__name__)


def run_dir() -> Path:
    """Hydra's output directory for this job (cwd when called outside a Hydra app)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path.cwd()


# -- the Hydra task -------------------------------------------------------------------------------------------
def _in_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except (ImportError, ValueError):
        return False


def _job_failed(status: str, message: str, prefix: str, code: int, out: Path | None = None, *,
                end_sweep: bool = False, record: bool = True) -> float:
    """Report a job that could not run or stopped. A single run exits with `code`; a job of a multirun writes
    its reason to status.json (the sweep summary shows it; not where record=False: the folder holds another run's)
    and returns NaN, so the sweep goes on (and ends with the largest such code), unless end_sweep (a stop signal:
    the user wants the whole sweep to stop)."""

    Console(stderr=True, soft_wrap=True).print(prefix + escape(message), highlight=False)
    if end_sweep or not _in_multirun():
        sys.exit(code)
    from rlgen.commands.sweep import note_failed_job

    note_failed_job(code)
    out = out or run_dir()
    if record and (read_status(out) or {}).get("state") not in ("stopped", "failed"):
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


def _shown(path: str | Path) -> str:
    """A path as a user would type it here: relative below the current directory, else absolute."""
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else str(Path(path).resolve())


def _resolve_resume(plan: Any, out: Path, console: Console) -> Any:
    """The ResumePoint for the config's resume= (None: start a new run). Raises ResumeError when it cannot be
    honoured."""

    cfg = plan.config
    current = identity(cfg, len(plan.learners))
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
    release_claim(hydra_dir)
    if {p.name for p in hydra_dir.iterdir()} <= {".hydra", LOG_FILE}:
        shutil.rmtree(hydra_dir, ignore_errors=True)


def _plan(cfg: RunConfig, out: Path) -> Any:
    """The plan the command line built with its validation pass, or (a job the command line did not see) the
    pass run here; a config it refuses raises PlanError (a refused sweep point: its job records why)."""

    plan = planned(cfg)
    if plan is not None:
        return plan
    report = preflight(cfg, run_dir=out)
    if report.blocking():
        raise PlanError(report.blocking())
    return report.plan


def train_app(dict_cfg) -> float:
    """Hydra entry point. Returns the last-20% mean reward, so sweeps have an objective."""

    run_launched()  # a multirun's later jobs: the time to the first rollout counts from the job's own start
    console = MirroredConsole()
    stop = StopFlag()
    stop.install()
    out = run_dir()
    steps = dict_cfg.get("steps")
    try:
        cfg = to_run_config(dict_cfg)
        plan = _plan(cfg, out)
        point = _resolve_resume(plan, out, console) if cfg.resume else None
        if point is not None:
            _move_into(point, out)
            out = point.run_dir
        summary = run_training(plan, out, console, resume=point, stop=stop, resume_command=_resume_command(out))
    except PlanError as err:
        return _job_failed("rejected", "\n".join(err.problems), "[bold red]error:[/] ", 2)
    except ResumeError as err:
        return _job_failed("rejected", str(err), "[bold red]error:[/] ", 2)
    except RunDirHeld as err:  # its status.json is the other run's
        return _job_failed("rejected", str(err), "[bold red]error:[/] ", 2, record=False)
    except RunStopped as err:
        where = f"; checkpoint {_shown(err.checkpoint)}" if err.checkpoint else "; no checkpoint yet"
        how = f"; resume with: {_resume_command(out)}" if err.checkpoint else ""
        return _job_failed("stopped", f"stopped at step {err.step} of {steps} ({err}){where}{how}", "", err.exit_code, out,
                           end_sweep=stop.requested)
    except RunError as err:
        return _job_failed("failed", f"{err} (details: {out / LOG_FILE})", "[bold red]run stopped:[/] ", 1, out)
    except UserError as err:  # another run holds the directory, a disk too full for a checkpoint ...
        return _job_failed("failed" if err.exit_code == 1 else "rejected", str(err), "[bold red]error:[/] ",
                           err.exit_code, out)
    except Exception as err:  # noqa: BLE001 - one line here, the traceback in run.log (run_training wrote it)
        log.info("the run failed", exc_info=err)
        return _job_failed("failed", f"unexpected {type(err).__name__}: {err} (details: {out / LOG_FILE})",
                           "[bold red]run stopped:[/] ", 1, out)
    finally:
        stop.uninstall()
    return float(summary["reward_last_20pct"])
