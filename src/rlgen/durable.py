"""Files written whole or not at all: a line appended to a log, a file replaced through a synced temporary copy.
A full disk or an unwritable folder leaves the file as it was, and the OSError (WriteFailed) names the file and
the fix. A small state file that must be written even on a full disk (``rewrite_small``). And a lock file that
one process at a time holds (``exclusive_lock``)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

FULL = (errno.ENOSPC, errno.EDQUOT)


class WriteFailed(OSError):
    """A write that did not happen: ``path`` is the file it was for, and the message (also its str) says what is
    left of the file and the fix."""

    def __init__(self, cause: OSError, path: Path, message: str):
        super().__init__(cause.errno, message)
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.strerror)


def _why(err: OSError) -> tuple[str, str]:
    """What went wrong, and the fix."""
    if err.errno in FULL:
        return "the disk is full", "free space on that disk"
    return err.strerror or str(err), "make sure that folder can be written"


def disk_full(err: BaseException | None) -> OSError | None:
    """The full disk (or quota) behind err, wherever it sits in its chain of causes (an actor's error carries
    its own as ``cause``); None when the disk is not why."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in FULL:
            return err
        err = getattr(err, "cause", None) or err.__cause__ or err.__context__
    return None


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
        raise WriteFailed(err, path, f"{path}: {why}, so a line was not written ({left}); {fix}.") from err


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
        raise WriteFailed(err, path, f"{path}: {why}, so it was not rewritten and keeps its previous content; "
                                     f"{fix} and try again.") from err


def rewrite_small(path: Path, text: str) -> None:
    """replace_text, and where the disk is too full for its temporary copy, ``path`` overwritten in place: the
    blocks it has already hold a small file (a status of a few KiB), so a full disk does not keep it from telling
    why a run ended. Not atomic in that case: a crash in the middle of that write may tear it. The text is padded
    with spaces to the old length (JSON and most text formats read it the same)."""
    try:
        replace_text(path, text)
    except OSError as err:
        if err.errno not in FULL:
            raise
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            raise err from None
        try:
            data = text.encode()
            data += b" " * max(0, os.fstat(fd).st_size - len(data))
            _write_all(fd, data)
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        except OSError:
            raise err from None
        finally:
            os.close(fd)


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold the lock file at path alone (other processes that ask for it wait) until the block ends."""
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
