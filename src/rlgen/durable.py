"""Files written whole or not at all: a line appended to a log, a file replaced through a synced temporary copy.
A full disk or an unwritable folder leaves the file as it was, and the OSError names the file and the fix. And a
lock file that one process at a time holds (``exclusive_lock``)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def _why(err: OSError) -> tuple[str, str]:
    """What went wrong, and the fix."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full", "free space on that disk"
    return err.strerror or str(err), "make sure that folder can be written"


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a write may take only part)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_line(fd: int, path: Path, line: str) -> None:
    """Append one whole line to ``fd`` (opened with O_APPEND) or nothing: on a failed write the file is cut
    back to its size before the line, and an OSError naming ``path`` says why."""
    before = os.fstat(fd).st_size
    try:
        _write_all(fd, line.encode())
    except OSError as err:
        try:
            os.ftruncate(fd, before)
            left = "it still ends with its last whole line"
        except OSError:
            left = f"part of the line may remain after byte {before}"
        why, fix = _why(err)
        raise OSError(err.errno, f"{path}: {why}, so a line was not written ({left}); {fix} and resume the "
                                 "run.") from err


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a temporary file is written, synced and renamed over it; when that
    fails the temporary file is removed and the old ``path`` stays as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            _write_all(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        why, fix = _why(err)
        raise OSError(err.errno, f"{path}: {why}, so it was not rewritten and keeps its previous content; {fix} "
                                 f"and try again.") from err


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold the lock file at path alone (other processes that ask for it wait) until the block ends."""
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
