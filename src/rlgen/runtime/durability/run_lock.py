"""One run per run directory: ``<run dir>/.rlgen.lock`` names the process that writes there.

``acquire_run_lock`` creates the file atomically with the holder's pid, host, start time and command. A live
holder refuses a second run (``RunLocked``); a lock whose holder is gone, or that cannot be read, is taken
over; a lock from another host always counts as alive; a directory that cannot be written (a full disk) is a
sentence (``RunDirUnwritable``). docs/durability.md says how a dead holder is told.

    with acquire_run_lock(run_dir, "rlgen train ...") as lock:
        if lock.stale:
            log.warning(lock.stale)
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlgen.durable import FULL
from rlgen.errors import UserError

if TYPE_CHECKING:
    from rlgen.types import JSONValue

LOCK_FILE = ".rlgen.lock"
_SETTLE_S = 2.0  # a lock file younger than this may be half written by the run creating it: read it again


@dataclass(frozen=True)
class LockInfo:
    """Who holds a lock. ``started``: wall time the lock was taken; ``proc_start``: the process's start time
    in clock ticks since boot (from /proc/<pid>/stat), which tells a live holder from a process that reuses
    its pid; None where /proc is not there."""

    pid: int
    host: str
    started: float
    command: str
    proc_start: int | None = None

    @classmethod
    def of_this_process(cls, command: str) -> LockInfo:
        return cls(os.getpid(), socket.gethostname(), time.time(), command, process_start(os.getpid()))

    @classmethod
    def from_json(cls, data: JSONValue) -> LockInfo:
        """Raises ValueError (or TypeError/KeyError) when ``data`` is not a lock's content."""
        start = data.get("proc_start")
        return cls(int(data["pid"]), str(data["host"]), float(data["started"]), str(data["command"]),
                   None if start is None else int(start))

    def since(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} (since {self.since()}, running: {_short(self.command)})"


class RunLocked(UserError):
    """Another live process holds the run directory's lock."""

    def __init__(self, run_dir: Path, holder: LockInfo | None, lock_path: Path):
        self.run_dir, self.holder, self.lock_path = run_dir, holder, lock_path
        if holder is None:  # several runs kept replacing the lock at once
            super().__init__(f"Run directory {run_dir} is being claimed by several runs at once; start one run "
                             f"per run directory, or choose another run directory for this one.")
            return
        super().__init__(
            f"Run directory {run_dir} is in use by pid {holder.pid} on {holder.host} since {holder.since()} "
            f"(running: {_short(holder.command)}); wait for that run to end, stop it, or choose another run "
            f"directory (hydra.run.dir=<another folder>, or drop resume= to start a fresh one), and if that "
            f"process is already gone, delete {lock_path}."
        )


class RunDirUnwritable(UserError):
    """The run directory, or its lock file, cannot be written (a full disk, a folder without write permission)."""

    def __init__(self, run_dir: Path, err: OSError):
        self.run_dir = run_dir
        if err.errno in FULL:
            why, fix = "the disk is full", f"free space on that disk (df -h {run_dir} shows what is left)"
        else:
            why, fix = err.strerror or str(err), "make it writable"
        super().__init__(f"the run directory {run_dir} cannot be written ({why}; its lock file {LOCK_FILE} could not "
                         f"be created); {fix}, or choose a run directory elsewhere (hydra.run.dir=<folder>).")


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (field 22 of /proc/<pid>/stat), or None
    when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        # the command name (field 2) is in parentheses and may hold spaces or ')': split after the last ')'
        return int(raw.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def holder_alive(info: LockInfo) -> bool:
    """Whether the lock's holder may still run: True for another host (cannot tell from here); on this host,
    False when no process has that pid, or the process with that pid started at another time than the
    holder did (the pid was reused)."""
    if info.host != socket.gethostname():
        return True
    if info.pid <= 0:
        return False
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # the pid exists but belongs to another user
    except OSError:
        return False
    if info.proc_start is not None:
        now = process_start(info.pid)
        if now is not None and now != info.proc_start:
            return False
    return True


_MISSING = object()  # read_lock's answer when the file is gone


def read_lock(path: Path) -> LockInfo | None | object:
    """The lock's holder; None when the file is unreadable or torn; _MISSING when there is no file."""
    try:
        return LockInfo.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return _MISSING
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _read_settled(path: Path) -> LockInfo | None | object:
    """read_lock, but a torn file that was just created is read again for a moment: its creator may still be
    writing it."""
    deadline = time.monotonic() + _SETTLE_S
    while True:
        got = read_lock(path)
        if got is not None or time.monotonic() >= deadline:
            return got
        try:
            if time.time() - path.stat().st_mtime >= _SETTLE_S:
                return None
        except OSError:
            return _MISSING
        time.sleep(0.05)


def _write_fd(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class RunLock:
    """A held lock. ``took_over``: the stale holder whose lock this one replaced (None when the lock was free
    or its file unreadable); ``stale``: one line saying what was replaced, for the log (None when nothing)."""

    path: Path
    holder: LockInfo
    took_over: LockInfo | None = None
    stale: str | None = None
    released: bool = False

    def held(self) -> bool:
        """Whether the lock file still names this holder."""
        got = read_lock(self.path)
        return isinstance(got, LockInfo) and _same(got, self.holder)

    def release(self) -> None:
        """Remove the lock file, but only while it still names this process (never another run's lock)."""
        if self.released:
            return
        self.released = True
        if self.held():
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_typed: list[str] = []  # the command line as the user typed it (set_command_line)
_claimed: dict[Path, RunLock] = {}  # locks taken before the run (claim_run_dir), by resolved directory


def set_command_line(line: str) -> None:
    """The command as the user typed it, which a lock names as its holder's (rlgen's CLI sets it first)."""
    _typed[:] = [line]


def command_line() -> str:
    """The command as the user typed it, else this process's argv."""
    return _typed[0] if _typed else " ".join(sys.argv)


def claim_run_dir(run_dir: str | Path, command: str | None = None) -> RunLock:
    """Take the run directory's lock before anything is written there (rlgen train takes it before Hydra writes
    its .hydra/ files); the run's own acquire_run_lock of that directory in this process then gets this lock.
    Released when the run ends, at the latest when this process exits. Raises RunLocked as acquire_run_lock."""
    lock = acquire_run_lock(run_dir, command or command_line())
    _claimed[Path(run_dir).resolve()] = lock
    atexit.register(lock.release)
    return lock


def release_claim(run_dir: str | Path) -> None:
    """Give back a lock claim_run_dir took and no run used (the run went on in another directory)."""
    lock = _claimed.pop(Path(run_dir).resolve(), None)
    if lock is not None:
        lock.release()


def acquire_run_lock(run_dir: str | Path, command: str, *,
                     probe: Callable[[LockInfo], bool] | None = None) -> RunLock:
    """Take ``<run_dir>/.rlgen.lock`` for this process (creating ``run_dir`` when needed). Raises RunLocked when
    a live process holds it, RunDirUnwritable when the folder or the lock file cannot be written (a full disk);
    takes over a lock whose holder is gone or whose file cannot be read. ``probe``
    tells whether a holder is alive (holder_alive by default). A lock this process claimed for the directory
    before (claim_run_dir) is handed over instead."""
    claimed = _claimed.pop(Path(run_dir).resolve(), None)
    if claimed is not None and claimed.held():
        return claimed
    run_dir = Path(run_dir)
    try:
        return _take(run_dir, command, probe or holder_alive)
    except OSError as err:  # a full disk, a folder that cannot be written: a sentence, not a traceback
        raise RunDirUnwritable(run_dir, err) from err


def _take(run_dir: Path, command: str, alive: Callable[[LockInfo], bool]) -> RunLock:
    """acquire_run_lock's work; an OSError means the directory or its lock file cannot be written."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    me = LockInfo.of_this_process(command)
    body = (json.dumps(asdict(me)) + "\n").encode()
    for _ in range(10):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            pass
        else:
            try:
                _write_fd(fd, body)
            except BaseException:
                path.unlink(missing_ok=True)
                raise
            return RunLock(path, me)
        old = _read_settled(path)
        if old is _MISSING:
            continue  # released meanwhile: try to create it again
        if isinstance(old, LockInfo) and alive(old):
            raise RunLocked(run_dir, old, path)
        # stale: replace the file in one rename, then read it back (two runs taking over at once: one wins)
        tmp = path.with_name(f"{LOCK_FILE}.{os.getpid()}.{time.time_ns()}.tmp")
        try:
            _write_fd(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), body)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        lock = RunLock(path, me)
        if lock.held():
            if isinstance(old, LockInfo):
                lock.took_over = old
                lock.stale = f"took over the lock of {old.describe()}, which is no longer running"
            else:
                lock.stale = f"replaced the unreadable lock file {path}"
            return lock
    got = read_lock(path)
    raise RunLocked(run_dir, got if isinstance(got, LockInfo) else None, path)


def _same(a: LockInfo, b: LockInfo) -> bool:
    return (a.pid, a.host, a.started) == (b.pid, b.host, b.started)


def _short(command: str, limit: int = 160) -> str:
    command = " ".join(command.split())
    return command if len(command) <= limit else command[: limit - 3] + "..."
