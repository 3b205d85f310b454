"""A run directory that already holds a run, and what a new run does about it (``existing_run``).

A folder holds a run once that run has written something a new run would destroy: metrics lines, a checkpoint, a
final model or a summary. Hydra's own files, a log and a status alone (a run refused before its first step) do not
count. A new run never writes into such a folder unless it continues that run (``resume=``); otherwise
``existing_run`` decides: ``refuse`` (the default) stops before anything is written, ``new`` runs in a folder of its
own beside it (``<dir>-2``, ``-3``, ...), ``replace`` deletes the other run's files first. docs/durability.md,
"A folder that already holds a run".
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from rlgen.config import ExistingRun
from rlgen.errors import UserError
from rlgen.runtime.durability.checkpoint_folder import CHECKPOINTS, checkpoint_step, list_checkpoints
from rlgen.runtime.durability.status_file import read_status

# What a run writes in its directory (README, "What a run writes"): existing_run=replace deletes these, and only
# these, so a folder that also holds files of the user's keeps them.
RUN_OUTPUTS = ("metrics.jsonl", "summary.json", "plan.json", "status.json", "run.log", "error.log", "resumes.jsonl",
               "timeline.png", "throughput.png", "reward.png", "resumed_into", "report.json", CHECKPOINTS,
               "final_model", ".hydra")
NEW_FOLDERS = 1_000  # existing_run=new tries <dir>-2 ... <dir>-<this> before it gives up


@dataclass(frozen=True)
class HeldRun:
    """The run a folder holds, as its status.json and checkpoints tell it."""

    path: Path
    state: str | None  # status.json's: finished, stopped, failed, running (a run that did not end cleanly) ...
    step: int | None  # the last finished step
    steps: int | None  # the steps it was asked for
    checkpoint: str | None  # its newest complete checkpoint's folder name

    def describe(self) -> str:
        what = {"finished": "a finished run", "stopped": "a stopped run", "failed": "a failed run",
                "running": "a run that did not end cleanly"}.get(self.state or "", "a run")
        at = [f"step {self.step} of {self.steps}" if self.step is not None and self.steps else ""]
        at.append(f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint")
        return f"{what} ({', '.join(a for a in at if a)})"


def _has_lines(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def held_run(folder: str | Path) -> HeldRun | None:
    """The run ``folder`` holds, or None when it holds none (missing, empty, or only Hydra's files and logs)."""
    folder = Path(folder)
    ckpts = folder / CHECKPOINTS
    any_checkpoint = ckpts.is_dir() and any(checkpoint_step(p) is not None for p in ckpts.iterdir())
    if not (any_checkpoint or _has_lines(folder / "metrics.jsonl") or (folder / "final_model").exists()
            or (folder / "summary.json").exists()):
        return None
    status = read_status(folder) or {}
    complete = list_checkpoints(folder)
    step, steps = status.get("step"), status.get("steps")
    return HeldRun(folder, status.get("state") if isinstance(status.get("state"), str) else None,
                   step if isinstance(step, int) else None, steps if isinstance(steps, int) else None,
                   complete[-1].name if complete else None)


class RunDirHeld(UserError):
    """A new run was pointed at a folder that holds another run, and existing_run=refuse."""

    def __init__(self, held: HeldRun, why: str = "", key: str = "hydra.run.dir"):
        self.held = held
        more = f"steps={2 * held.step}" if held.step else "steps=<more>"
        further = (f"; to train it further, resume={held.path} {more} with its settings{why}" if held.checkpoint
                   else why)
        super().__init__(
            f"{held.path} holds {held.describe()}, and a new run there would overwrite it{further}; to start a new run, "
            f"choose another folder ({key}=<folder>), or set existing_run=new (a folder of its own beside it) "
            "or existing_run=replace (deletes that run's metrics, checkpoints and final model first).")


def new_folder(folder: str | Path) -> Path:
    """The first of <folder>-2, <folder>-3, ... that does not exist yet."""
    folder = Path(folder)
    for k in range(2, NEW_FOLDERS + 1):
        candidate = folder.with_name(f"{folder.name}-{k}")
        if not candidate.exists():
            return candidate
    raise UserError(f"{folder}-2 to -{NEW_FOLDERS} all exist; choose another folder (hydra.run.dir=<folder>).")


def clear_run(folder: str | Path, keep: tuple[str, ...] = ()) -> None:
    """Delete what a run wrote in folder (RUN_OUTPUTS, less keep), nothing else: its lock and the user's own files
    stay."""
    folder = Path(folder)
    for name in (n for n in RUN_OUTPUTS if n not in keep):
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def settle(folder: str | Path, policy: ExistingRun | str, why: str = "", keep: tuple[str, ...] = ()) -> tuple[Path, str]:
    """The folder a new run (one that continues no run) writes in, and a line saying what became of the run
    folder held ("" where it held none): folder itself when it holds no run; else, by policy, RunDirHeld (refuse,
    why: a clause on why a resume was not taken), <folder>-<k> (new), or folder once that run's files are deleted
    (replace; keep: RUN_OUTPUTS that stay, such as Hydra's files of this run)."""
    folder = Path(folder)
    held = held_run(folder)
    if held is None:
        return folder, ""
    policy = ExistingRun(policy)
    if policy is ExistingRun.refuse:
        raise RunDirHeld(held, why)
    if policy is ExistingRun.new:
        other = new_folder(folder)
        return other, f"{folder} holds {held.describe()}; this run writes to {other} (existing_run=new)."
    clear_run(folder, keep)
    return folder, f"{folder} held {held.describe()}; its files were deleted (existing_run=replace)."


__all__ = ["RUN_OUTPUTS", "HeldRun", "RunDirHeld", "clear_run", "held_run", "new_folder", "settle"]
