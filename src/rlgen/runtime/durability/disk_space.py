"""Room on disk for what a run writes: the whole run, checked as it starts (``check_run_fits``: what it will
write, with the checkpoints its run directory holds already, against the free space), the check before each
checkpoint (a disk that filled since then stops the run with a sentence instead of a torn write), and the size of
a folder (the last checkpoint predicts the next). The sizes and the probe are rlgen.plan.checks.disk_room's;
whether a folder can be written at all is the validation pass's (rlgen.plan.checks.inputs.writable)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlgen.errors import UserError
from rlgen.plan import Plan
from rlgen.plan.checks import disk_room
from rlgen.plan.checks.disk_room import (
    OnDisk,
    nearest_existing,
    needed_with_headroom,
    room_problems,
    size_text,
)
from rlgen.runtime.durability.checkpoint_folder import list_checkpoints

if TYPE_CHECKING:
    from rlgen.runtime.durability.resume import ResumePoint


class DiskFull(UserError):
    """Not enough free space for what the run is about to write: ``path`` (where), ``free`` and ``need`` (bytes,
    headroom included)."""

    exit_code = 1

    def __init__(self, message: str, *, path: Path | None = None, free: int = 0, need: int = 0):
        super().__init__(message)
        self.path, self.free, self.need = path, free, need


class DiskTooSmall(DiskFull):
    """The run cannot start: a disk cannot hold what it will write (one sentence per disk)."""

    exit_code = 2


def check_run_fits(plan: Plan, run_dir: str | Path, resume: ResumePoint | None = None, resume_command: str | None = None) -> None:
    """Raise DiskTooSmall, before the run writes anything, when the disks cannot hold what it will write: its
    checkpoints (counting those run_dir holds already), final_model/merged and a preset model still to build.
    resume: the ResumePoint it continues; resume_command: what continues it, said in the fix."""
    on_disk = OnDisk(tuple(folder_bytes(p) for p in list_checkpoints(run_dir)), resume.step if resume else None)
    problems = room_problems(plan, run_dir, on_disk, resume_command=resume_command)
    if problems:
        raise DiskTooSmall("\n".join(problems), path=Path(run_dir))


def free_space(path: str | Path, need_bytes: int, small_bytes: int,
               free_bytes: Callable[[Path], int] | None = None) -> tuple[int, int]:
    """(free bytes, bytes needed with headroom) on the file system holding ``path`` (probed at its nearest existing
    ancestor) for a write of ``need_bytes`` beside the run's small files (``small_bytes``: plan.disk's).
    ``free_bytes``: a stand-in for the probe."""
    free = (free_bytes or disk_room.free_bytes_at)(nearest_existing(path))
    return free, needed_with_headroom(need_bytes, small_bytes)


def check_free_space(path: str | Path, need_bytes: int, *, keep: int, small_bytes: int, what: str = "a checkpoint",
                     free_bytes: Callable[[Path], int] | None = None) -> None:
    """Raise DiskFull when the file system holding ``path`` has less free space than ``need_bytes`` plus
    headroom. ``need_bytes``: what the write adds (the newest checkpoint's folder_bytes is a good guess; older
    checkpoints are pruned only after the new one is complete). ``keep``: checkpoint.keep, named in the fix;
    ``small_bytes``: what the run's metrics, status, logs and reports take (plan.disk.small_bytes)."""
    free, need = free_space(path, need_bytes, small_bytes, free_bytes)
    if free >= need:
        return
    fewer = f", or keep fewer checkpoints (now checkpoint.keep={keep})" if keep > 1 else ""
    raise DiskFull(f"{path} has {size_text(free)} free but {what} needs about {size_text(need)}; free some space on "
                   f"that disk{fewer}.", path=Path(path), free=free, need=need)


def folder_bytes(path: str | Path) -> int:
    """Total size of the files under folder ``path`` (0 when it does not exist); a file hard-linked several
    times counts once, symbolic links are not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue  # removed meanwhile
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                seen.add(key)
                total += st.st_size
    return total


__all__ = ["DiskFull", "DiskTooSmall", "check_free_space", "check_run_fits", "folder_bytes", "free_space",
           "needed_with_headroom"]
