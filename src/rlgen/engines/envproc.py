"""Environments in processes of their own, so that a call that hangs can be stopped.

Each episode's environment lives in a process of its own, forked from an environment host: one small Python
process per engine and environment (``task.env`` and ``task.env_args``), started on first use and kept for the
engine's life, which imports the environment's class and builds one instance before it forks any episode's
process, so each starts with the class's imports and caches made (rlgen.engines.envproc_host). Here is the
engine's side: the host (``EnvHost``) and a handle per episode (``EnvProcess``), whose calls go over a socket of
the episode's own and wait at most ``task.env_timeout_s`` for the answer; past it, the host kills that process
(and its process group) and the episode ends, while the others go on. A process whose episode ended as it should
(its environment's close() answered) plays a later episode, with a new instance; one that timed out or died is
not used again. Every wait here has a bound, so a thread that makes a call is free again by then at the latest.
Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from rlgen.engines.envproc_host import CLOSE_GRACE_S, END, FAILED, FORK, KILL, READY, RECORD
from rlgen.tasks.base import TaskDataError

HOST_START_S = 60.0  # the host's start: its Python, the environment's imports and one instance built
SEND_TIMEOUT_S = 10.0  # a record to the host (which reads them at once)
IDLE_HOSTS = 4  # hosts kept with no episode running (other environments' or arguments'), the newest
IDLE_PROCESSES = 1024  # a host's processes kept for later episodes, their last episode over


class EnvCallError(Exception):
    """The environment raised in its process (kind: the exception's type name), or the process went away."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class EnvTimeout(TimeoutError):
    """A call ran past its timeout; its episode's process was killed."""


class EnvHost:
    """One environment host process: it forks the episodes' processes, and kills them on request; those whose
    episode ended as it should wait here (``idle``) for a later episode."""

    def __init__(self, name: str, cls: Any, args: dict[str, Any]):
        self.name = name
        try:
            cls_bytes = pickle.dumps(cls)
        except Exception as err:  # noqa: BLE001 - a class defined inside a function, or in __main__
            raise TaskDataError(f"task.env={name!r} cannot be sent to its environment process ({err}); define the "
                                "class at the top level of an importable module.") from err
        self.ctrl, theirs = socket.socketpair()
        self.ctrl.settimeout(SEND_TIMEOUT_S)
        self.proc = subprocess.Popen([sys.executable, "-m", "rlgen.engines.envproc_host", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.PIPE)
        theirs.close()
        self.started = time.monotonic()
        self.proc.stdin.write(pickle.dumps((list(sys.path), cls_bytes, args)))
        self.proc.stdin.close()
        self.ready = False
        self.forks = threading.Lock()  # one fork request (and its answer) at a time
        self.sends = threading.Lock()
        self.running = 0  # processes playing an episode
        self.idle: deque[tuple[int, Connection, float]] = deque()  # (pid, socket, when it was told to close)
        self.pool = threading.Lock()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def acquire(self, deadline: float) -> tuple[int, Connection]:
        """A process for a new episode: the one idle longest when its environment's close() has answered, else a
        new one (``fork``)."""
        with self.pool:
            while self.idle:
                pid, conn, at = self.idle[0]
                closed = _answered(conn)
                if closed is None and time.monotonic() - at < CLOSE_GRACE_S:
                    break  # still closing: a new process rather than a wait
                self.idle.popleft()
                if closed:
                    self.running += 1
                    return pid, conn
                self._let_go(pid, conn)
        return self.fork(deadline)

    def release(self, pid: int, conn: Connection) -> None:
        """The episode is over and its process was told to close its environment: kept for a later episode."""
        with self.pool:
            self.running -= 1
            if len(self.idle) < IDLE_PROCESSES:
                self.idle.append((pid, conn, time.monotonic()))
                return
        self._let_go(pid, conn)

    def _let_go(self, pid: int, conn: Connection) -> None:
        """The process exits (its socket closed), or the host kills it after a grace."""
        conn.close()
        self._send(END, pid)

    def fork(self, deadline: float) -> tuple[int, Connection]:
        """A new episode's process (its pid and the engine's end of its socket). The host's start is waited for
        up to HOST_START_S after it began, besides ``deadline``; raises EnvTimeout or EnvCallError."""
        until = max(deadline, self.started + HOST_START_S)
        if not self.forks.acquire(timeout=max(0.0, until - time.monotonic())):
            raise EnvTimeout(f"the environment host of task.env={self.name!r} did not start in time")
        try:
            if not self.ready:
                self._expect(READY, until, f"the environment host did not start within {HOST_START_S:g} s "
                                           f"(importing or building task.env={self.name!r} hangs)")
                self.ready = True
            self._send(FORK, 0)
            try:
                op, pid, fds = self._answer(time.monotonic() + SEND_TIMEOUT_S, "the environment host did not fork "
                                                                              "a process in time")
            except EnvTimeout:
                self.proc.kill()  # a late answer would be taken for the next request's: a new host instead
                raise
            if op == FAILED or not fds:
                raise EnvCallError("OSError", f"the environment host could not fork a process (errno {pid})")
            with self.pool:
                self.running += 1
            return pid, Connection(fds[0])
        finally:
            self.forks.release()

    def kill(self, pid: int) -> None:
        """Kill a process playing an episode (a call ran past its timeout, or it cannot be reached)."""
        with self.pool:
            self.running -= 1
        self._send(KILL, pid)

    def stop(self) -> None:
        """Stop the host; its processes die with it."""
        self.ctrl.close()
        self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=SEND_TIMEOUT_S)

    def _send(self, op: bytes, value: int) -> None:
        with self.sends:
            try:
                self.ctrl.sendall(RECORD.pack(op, value))
            except OSError:
                pass  # the host is gone, and with it its processes

    def _expect(self, op: bytes, until: float, why: str) -> None:
        got, _, _ = self._answer(until, why)
        if got != op:
            raise EnvCallError("RuntimeError", f"the environment host answered {got!r}, not {op!r}")

    def _answer(self, until: float, why: str) -> tuple[bytes, int, list[int]]:
        """The host's next record (and a descriptor that came with it); raises EnvTimeout(why) past ``until``,
        EnvCallError when the host has exited."""
        data, fds = b"", []
        while len(data) < RECORD.size:
            ready, _, _ = select.select([self.ctrl], [], [], max(0.0, until - time.monotonic()))
            if not ready:
                raise EnvTimeout(why)
            chunk, more, _, _ = socket.recv_fds(self.ctrl, RECORD.size - len(data), 1)
            if not chunk:
                code = self.proc.poll()
                raise EnvCallError("RuntimeError", f"the environment host exited (code {code}); the engine's log "
                                                   "has its error")
            data, fds = data + chunk, fds + list(more)
        op, value = RECORD.unpack(data)
        return op, value, fds


_HOSTS: dict[str, EnvHost] = {}
_LOCK = threading.Lock()


def host_for(name: str, args: dict[str, Any]) -> EnvHost:
    """The host for this environment and these arguments, started when there is none alive."""
    from rlgen.tasks.envs import env_class

    key = json.dumps([name, args], sort_keys=True, default=str)
    with _LOCK:
        host = _HOSTS.get(key)
        if host is not None and host.alive:
            _HOSTS[key] = _HOSTS.pop(key)  # the newest last
            return host
        host = _HOSTS[key] = EnvHost(name, env_class(name), args)
        idle = [k for k, h in _HOSTS.items() if k != key and (not h.running or not h.alive)]
        for k in idle[: max(0, len(idle) - IDLE_HOSTS)]:
            _HOSTS.pop(k).stop()
        return host


class EnvProcess:
    """One episode's environment, in a process of its own: reset and step wait at most ``timeout_s`` for the
    answer (counted once the process exists), then kill it and raise EnvTimeout."""

    def __init__(self, name: str, args: dict[str, Any]):
        self.name, self.args = name, args
        self.host: EnvHost | None = None
        self.pid, self.conn = 0, None
        self.over = False

    def reset(self, prompt: Any, seed: int, timeout_s: float) -> Any:
        self.host = host_for(self.name, self.args)
        self.pid, self.conn = self.host.acquire(time.monotonic() + timeout_s)
        return self._call(("reset", prompt, seed), timeout_s)

    def step(self, action: str, timeout_s: float) -> Any:
        return self._call(("step", action), timeout_s)

    def _call(self, msg: tuple, timeout_s: float) -> Any:
        if self.conn is None or self.over:
            raise EnvCallError("RuntimeError", "the episode's environment process is gone")
        self.conn.send(msg)
        if not self.conn.poll(timeout_s):
            self.kill()
            raise EnvTimeout(f"the environment's {msg[0]}() took longer than task.env_timeout_s={timeout_s:g}; "
                             "its process was killed")
        try:
            reply = self.conn.recv()
        except (EOFError, OSError) as err:
            self.kill()
            raise EnvCallError("RuntimeError", f"the environment's process exited during {msg[0]}() "
                                               f"({type(err).__name__})") from err
        if reply[0] == "ok":
            return reply[1]
        raise EnvCallError(reply[1], reply[2])

    def kill(self) -> None:
        """Stop the episode's process now."""
        if self.host is not None and self.pid and not self.over:
            self.over = True
            self.host.kill(self.pid)
            self._drop()

    def close(self) -> None:
        """The episode is over: its environment's close() runs, and its process waits for a later episode."""
        if self.host is not None and self.pid and not self.over:
            self.over = True
            conn, self.conn = self.conn, None
            try:
                conn.send(("close",))
            except OSError:
                self.host.kill(self.pid)
                conn.close()
                return
            self.host.release(self.pid, conn)

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


def _answered(conn: Connection) -> bool | None:
    """Whether a process told to close has answered that it did (False: it went away; None: not yet)."""
    try:
        if not conn.poll(0):
            return None
        return conn.recv() == ("ok", None)
    except (EOFError, OSError):
        return False
