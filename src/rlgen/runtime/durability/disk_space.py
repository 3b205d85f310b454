"""Room on disk for what a run writes: a check before a checkpoint is written (so a full disk stops the run with
a sentence instead of a torn write), and the size of a folder (the last checkpoint predicts the next). Whether a
folder can be written at all is the validation pass's (rlgen.plan.checks.inputs.writable)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from rlgen.errors import UserError

HEADROOM_FRACTION = 0.05  # the next checkpoint may be a little larger than the last one
HEADROOM_BYTES = 64 * 2**20  # and the run keeps writing metrics, status and logs beside it
GB = 1e9


class DiskFull(UserError):
    """Not enough free space for what the run is about to write."""

    exit_code = 1


def nearest_existing(path: str | Path) -> Path:
    """``path`` itself when it exists, else its nearest ancestor that does."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes_at(path: Path) -> int:
    """Free bytes, for this user, on the file system holding ``path`` (which must exist)."""
    return shutil.disk_usage(path).free


def needed_with_headroom(need_bytes: int) -> int:
    """need_bytes plus 5% plus 64 MiB."""
    return int(max(0, need_bytes) * (1 + HEADROOM_FRACTION)) + HEADROOM_BYTES


def check_free_space(path: str | Path, need_bytes: int, *, keep: int, what: str = "a checkpoint",
                     free_bytes: Callable[[Path], int] | None = None) -> None:
    """Raise DiskFull when the file system holding ``path`` (probed at its nearest existing ancestor) has less
    free space than ``need_bytes`` plus headroom. ``need_bytes``: what the write adds (the newest checkpoint's
    folder_bytes is a good guess; older checkpoints are pruned only after the new one is complete).
    ``keep``: checkpoint.keep, named in the fix. ``free_bytes``: a stand-in for the probe."""
    probed = nearest_existing(path)
    free = (free_bytes or free_bytes_at)(probed)
    need = needed_with_headroom(need_bytes)
    if free >= need:
        return
    raise DiskFull(
        f"{path} has {_gb(free)} free but {what} needs about {_gb(need)}; free some space on that disk, point the "
        f"run directory at a larger one (hydra.run.dir=...), or keep fewer checkpoints (now checkpoint.keep={keep})."
    )


def _gb(n: float) -> str:
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / GB:.2f} GB"


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
