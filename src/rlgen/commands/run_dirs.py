"""Where `rlgen train` writes, fixed before Hydra starts: the run directory (a sweep's folder with -m) is filled
in, locked, and held against a run it may already hold (``existing_run``), all before Hydra writes its .hydra/
files there. So a second run on a live directory is refused, and a finished run is never overwritten, before
anything is touched."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rlgen.commands.args import Args
from rlgen.config import ExistingRun, RunConfig
from rlgen.config.compose import run_dir_template, sweep_dir_template
from rlgen.runtime.durability.resume import continues, identity, search_root_of
from rlgen.runtime.durability.run_folder import RunDirHeld, held_run, new_folder, settle
from rlgen.runtime.durability.run_lock import claim_run_dir, release_claim

JOB_SUBDIR = "${hydra.job.num}"  # Hydra's default hydra.sweep.subdir: job k writes in <sweep dir>/k


def pin_run_dir(args: Args, jobs: list[tuple[RunConfig, Any]] = ()) -> list[str]:
    """The overrides to hand Hydra instead of args.overrides: hydra.run.dir (hydra.sweep.dir with -m) set to the
    folder this run writes in, its ${now:...} filled in. jobs: each job's config and plan, in the sweep's order.
    Raises RunLocked (a live run holds the folder) or RunDirHeld (it holds another run, existing_run=refuse), both
    UserErrors. A folder only Hydra can resolve (another interpolation) is left to the run's own checks."""
    if args.print_only or args.own_config:
        return args.overrides
    if args.multirun:
        return _pin_sweep_dir(args, jobs)
    path = fill_now(run_dir_template(args.overrides))
    if path is None:
        return args.overrides
    claim_run_dir(path)  # as Hydra will make it: relative to here, no ~ expanded
    if jobs:
        cfg, plan = jobs[0]
        folder = _settled(Path(path), cfg, plan, search_root_of(path))
        if folder != Path(path):
            release_claim(path)
            path = str(folder)
            claim_run_dir(path)
    return [*_without(args.overrides, "hydra.run.dir="), f"hydra.run.dir={hydra_quoted(path)}"]


def _settled(folder: Path, cfg: RunConfig, plan: Any, search_root: Path | None) -> Path:
    """The folder a single run writes in: folder, unless it holds a run this one does not continue (settle)."""
    if held_run(folder) is None:
        return folder
    going_on, why = continues(folder, cfg.resume, identity(plan.config, len(plan.learners)), search_root)
    if going_on:
        return folder
    settled, said = settle(folder, cfg.existing_run, why)
    if said:
        Console(stderr=True, soft_wrap=True).print(f"[yellow]note:[/] {escape(said)}", highlight=False)
    return settled


def _pin_sweep_dir(args: Args, jobs: list[tuple[RunConfig, Any]]) -> list[str]:
    """A sweep with a fixed folder: each job's folder (<sweep dir>/<k>) that holds a run no job continues is
    refused, left for a sweep folder of its own, or cleared, by the jobs' existing_run."""
    raw, subdir = sweep_dir_template([o for o in args.overrides if o not in args.settings])  # the sweep's own left out
    sweep = fill_now(raw)
    if sweep is None or subdir != JOB_SUBDIR or not jobs:
        return args.overrides
    held = [(cfg, held_run(Path(sweep) / str(k))) for k, (cfg, _) in enumerate(jobs)]
    held = [(cfg, h) for cfg, h in held if h is not None and not cfg.resume]
    if not held:
        return args.overrides
    policy = held[0][0].existing_run
    if policy is ExistingRun.refuse:
        raise RunDirHeld(held[0][1], f" (one of {len(held)} job folders of the sweep {sweep} that hold a run)",
                         key="hydra.sweep.dir")
    if policy is ExistingRun.new:
        other = new_folder(sweep)
        runs = f"{len(held)} run{'s' if len(held) != 1 else ''}"
        note = f"{sweep} holds {runs} of an earlier sweep; this sweep writes to {other} (existing_run=new)."
        sweep = str(other)
    else:
        for cfg, h in held:
            settle(h.path, cfg.existing_run)
        note = f"{len(held)} job folder(s) of {sweep} held a run; their files were deleted (existing_run=replace)."
    Console(stderr=True, soft_wrap=True).print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    return [*_without(args.overrides, "hydra.sweep.dir="), f"hydra.sweep.dir={hydra_quoted(sweep)}"]


def _without(overrides: list[str], key: str) -> list[str]:
    return [o for o in overrides if not o.lstrip("+").startswith(key)]


def fill_now(raw: str, now: Any = None) -> str | None:
    """raw with each ${now:<format>} filled in as Hydra does (one instant for all); None when another
    interpolation is left."""

    now = now or datetime.datetime.now()
    filled = re.sub(r"\$\{now:([^}]*)\}", lambda m: now.strftime(m.group(1)), raw)
    return None if "${" in filled else filled


def hydra_quoted(value: str) -> str:
    """value as Hydra's override parser reads it back unchanged: bare where it can be, else single-quoted."""

    if re.fullmatch(r"[\w./+:@%-]+", value):
        return value
    # inside quotes a backslash is itself, except before a quote or the closing quote, where it is doubled
    value = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
    return "'" + value.replace("'", "\\'") + "'"


__all__ = ["fill_now", "hydra_quoted", "pin_run_dir"]
