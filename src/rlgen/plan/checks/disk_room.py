"""Room on disk for what a run writes, before its first step: its checkpoints at the most there are at once,
final_model/merged and the preset model built into cache_dir (plan.disk), held against the free space of the
file system each goes to, with headroom for the run's own small files (plan.disk's small_bytes: metrics, status,
logs, reports) and 5% for a checkpoint larger than estimated. A disk too small is one sentence naming
the folder, what is free, what is needed and the settings that fix it.

``rlgen train`` checks a new run in its validation pass, before it writes anything; every run is checked again
as it starts (runtime.run), where a resumed run's checkpoints are known. The free space is probed here
(``free_bytes_at``), for these checks and the one before each checkpoint (runtime.durability.disk_space).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlgen.models.build import built_model
from rlgen.plan.disk import checkpoints_at_once, checkpoints_written
from rlgen.plan.resolved import Plan

HEADROOM_FRACTION = 0.05  # a checkpoint may be a little larger than predicted (or than the last one)
WRITE_LESS = (("keep", 1), ("every", 0))  # checkpoint settings that shrink a run's writes: one kept, only the last


@dataclass(frozen=True)
class OnDisk:
    """What a run finds in its run directory as it starts: the sizes of its complete checkpoints, oldest first,
    and the step it resumes at (None: a new run)."""

    checkpoints: tuple[int, ...] = ()
    resumed_at: int | None = None


def nearest_existing(path: str | Path) -> Path:
    """``path`` itself when it exists, else its nearest ancestor that does."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes_at(path: Path) -> int:
    """Free bytes, for this user, on the file system holding ``path`` (which must exist)."""
    return shutil.disk_usage(path).free


def needed_with_headroom(need_bytes: int, small_bytes: int = 0) -> int:
    """need_bytes plus 5%, plus small_bytes: what the run keeps writing beside it (its metrics, status, logs and
    reports: plan.disk.small_bytes; 0 on a disk the run only builds its model on)."""
    return int(max(0, need_bytes) * (1 + HEADROOM_FRACTION)) + max(0, small_bytes)


def size_text(n: float) -> str:
    """Bytes as a person reads them: 43.8 GB, 12.5 MB, 200 KB."""
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} KB"


def run_dir_bytes(plan: Plan, on_disk: OnDisk, *, keep: int | None = None, every: int | None = None) -> int:
    """What the run still adds under its run directory at the most (with checkpoint.keep and checkpoint.every
    as given, the config's otherwise): its checkpoints at the most there are at once, less the ones already
    there, and final_model/merged. A checkpoint is as large as the newest one there, or the plan's estimate."""
    c = plan.config.checkpoint
    start = on_disk.resumed_at or 0
    written = checkpoints_written(c.every if every is None else every, plan.config.steps, start)
    at_once = checkpoints_at_once(c.keep if keep is None else keep, written, len(on_disk.checkpoints),
                                  pinned=on_disk.resumed_at is not None)
    size = on_disk.checkpoints[-1] if on_disk.checkpoints else plan.disk.checkpoint_bytes
    return max(0, at_once * size - sum(on_disk.checkpoints)) + plan.disk.merged_bytes


def room_problems(plan: Plan, run_dir: str | Path, on_disk: OnDisk | None = None, *, built: bool | None = None,
                  resume_command: str | None = None, free_bytes: Callable[[Path], int] | None = None) -> list[str]:
    """One sentence per file system that cannot hold what the run writes there (none when all fit). on_disk:
    what the run directory holds already (None: a new run); built: whether the preset model is in cache_dir
    already (None: look; model.path given: nothing to build); resume_command: what continues a resumed run, said
    in its fix; free_bytes: a stand-in for the probe."""
    if plan.disk is None:
        return []
    on_disk = on_disk or OnDisk()
    built = built_model(plan.config, plan.device) is not None if built is None else built
    probe = free_bytes or free_bytes_at
    run_dir = Path(run_dir)
    cache = Path(plan.config.cache_dir).expanduser()
    build = 0 if built else plan.disk.build_bytes
    here = nearest_existing(run_dir)
    together = build > 0 and _same_disk(here, nearest_existing(cache))
    free = probe(here)
    problems = []
    extra = build if together else 0
    if free < needed_with_headroom(run_dir_bytes(plan, on_disk) + extra, plan.disk.small_bytes):
        problems.append(_run_dir_sentence(plan, run_dir, on_disk, free, extra, resume_command))
    if build and not together:
        cache_free = probe(nearest_existing(cache))
        need = needed_with_headroom(build)
        if cache_free < need:
            problems.append(f"cache_dir={plan.config.cache_dir} has {size_text(cache_free)} free, but building the "
                            f"model {plan.model.name} there needs about {size_text(need)}; free space on that disk or "
                            "set cache_dir=<a folder on a larger one>.")
    return problems


def check_room(plan: Plan, run_dir: str | Path, problems: list[str]) -> None:
    """A new run's disks against what it writes (the validation pass, before anything is written)."""
    problems += room_problems(plan, run_dir)


def _same_disk(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


def _run_dir_sentence(plan: Plan, run_dir: Path, on_disk: OnDisk, free: int, build: int,
                      resume_command: str | None) -> str:
    """The run directory's disk is too small: what the run writes there, and the fixes that make it fit."""
    cfg, d = plan.config, plan.disk
    c = cfg.checkpoint
    writes = run_dir_bytes(plan, on_disk) + build
    need = needed_with_headroom(writes, d.small_bytes)
    what = _checkpoints_text(plan, on_disk)
    if d.merged_bytes:
        what += f", final_model/merged ({size_text(d.merged_bytes)})"
    if build:
        what += f", the model {plan.model.name} built into cache_dir={cfg.cache_dir} ({size_text(build)})"
    what += f", and {size_text(need - writes)} of headroom (logs, metrics, a checkpoint larger than estimated)"
    fixes = []
    for name, value in WRITE_LESS:
        if getattr(c, name) != value:
            smaller = needed_with_headroom(run_dir_bytes(plan, on_disk, **{name: value}) + build, d.small_bytes)
            if smaller <= free:
                fixes.append(f"checkpoint.{name}={value} (it needs about {size_text(smaller)})")
    if build and needed_with_headroom(writes - build, d.small_bytes) <= free:
        fixes.append("cache_dir=<a folder on another disk> to build the model there")
    alts = "".join(f", or {f}" for f in fixes)
    if on_disk.resumed_at is None:
        return (f"{run_dir} has {size_text(free)} free, but this run needs about {size_text(need)} there: {what}; "
                f"free space on that disk, or point the run directory at a larger one (hydra.run.dir=<folder>){alts}.")
    command = resume_command or f"resume={run_dir} and the same settings"
    return (f"{run_dir} has {size_text(free)} free, but the rest of this run needs about {size_text(need)} there: "
            f"{what}; free space on that disk{alts}, then resume with: {command}.")


def _checkpoints_text(plan: Plan, on_disk: OnDisk) -> str:
    """The checkpoints the run writes, in words: how large each is, and how many are on disk at once."""
    c, d = plan.config.checkpoint, plan.disk
    written = checkpoints_written(c.every, plan.config.steps, on_disk.resumed_at or 0)
    at_once = checkpoints_at_once(c.keep, written, len(on_disk.checkpoints), on_disk.resumed_at is not None)
    size = on_disk.checkpoints[-1] if on_disk.checkpoints else d.checkpoint_bytes
    parts = (f"the weights {size_text(d.model_bytes)} and the optimizer state {size_text(d.learner_bytes)}"
             if not on_disk.checkpoints else "as large as the newest one there")
    if written == 1 and not on_disk.checkpoints:
        return f"its checkpoint at the end, about {size_text(size)} ({parts})"
    return (f"{at_once} checkpoints of about {size_text(size)} on disk at once ({parts}; checkpoint.keep={c.keep} "
            "stay while the next is written)")


__all__ = ["HEADROOM_FRACTION", "OnDisk", "check_room", "free_bytes_at", "nearest_existing",
           "needed_with_headroom", "room_problems", "run_dir_bytes", "size_text"]
