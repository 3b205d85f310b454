"""The environment host (``python -m rlgen.engines.envproc_host FD``) and the episode processes it forks.

The host reads what to build from its stdin (the engine's ``sys.path``, the environment's class pickled by
reference, and its keyword arguments), imports the class and builds one instance (which is dropped), says it is
ready, then serves requests on the control socket FD, one record (``RECORD``: an op and a number) each:

    F 0     fork an episode's process; the answer is F <pid> with the engine's end of its socket attached
    E pid   the engine let the process go (closed its socket): kill it unless it has exited in CLOSE_GRACE_S
    K pid   kill it now (a call ran past its timeout)

The host runs no environment code after it is ready, so it never hangs; it kills every process it forked and
exits when the engine closes the socket (or dies). An episode's process answers ("reset", prompt, seed), which
builds a new instance, ("step", action) and ("close",) on its socket, one at a time: ("ok", value) or ("raised",
type name, message); the engine may give it one episode after another. It has a process group of its own (what
it starts dies with it) and dies with the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import inspect
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

RECORD = struct.Struct("!cq")  # an op (one byte) and a number (a pid, or 0)
FORK, END, KILL, READY, FAILED = b"F", b"E", b"K", b"R", b"X"
CLOSE_GRACE_S = 5.0  # a process let go has this long to run its environment's close() and exit
REAP_S = 0.5  # how often the host looks for exited processes and ended ones past their grace
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: a new process only calls it


def call(fn: Any, *args: Any) -> Any:
    """fn(*args), run to its end when it is a coroutine function."""
    out = fn(*args)
    return asyncio.run(out) if inspect.isawaitable(out) else out


# -- an episode's process -----------------------------------------------------------------------------------
def episode(sock: socket.socket, cls: Any, why_not: str, args: dict[str, Any]) -> None:
    """Answer the engine's calls on sock, one at a time, until it goes away. Each reset builds a new instance
    (the process plays one episode after another); close runs the instance's close() and answers ("ok", None)."""
    conn = Connection(sock.detach())
    env = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] == "close":
            _close(env)
            env = None
            conn.send(("ok", None))
            continue
        try:
            if msg[0] == "reset":
                _close(env)
                env = None
                if cls is None:
                    raise ImportError(why_not)
                env = cls(**args)
                out = call(env.reset, *msg[1:])
            else:
                out = call(env.step, *msg[1:])
            reply: tuple = ("ok", out)
        except BaseException as err:  # noqa: BLE001 - whatever the environment raises ends its episode only
            reply = ("raised", type(err).__name__, str(err))
        try:
            conn.send(reply)
        except Exception as err:  # noqa: BLE001 - an answer that does not pickle
            conn.send(("raised", "TypeError", f"{msg[0]}() returned a {type(reply[1]).__name__}, which cannot be "
                                              f"sent back from the environment's process ({err})"))
    _close(env)


def _close(env: Any) -> None:
    with contextlib.suppress(BaseException):
        getattr(env, "close", lambda: None)()


def _die_with_host(host: int) -> None:
    """This process is killed when the host exits (Linux), and stops now if it already has."""
    with contextlib.suppress(Exception):
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != host:
        os._exit(0)


# -- the host ---------------------------------------------------------------------------------------------
class Host:
    """The host's loop: the engine's requests on ctrl (fork, let go, kill), and its processes reaped as they exit
    (or killed, when let go and still running after CLOSE_GRACE_S)."""

    def __init__(self, ctrl: socket.socket, cls: Any, why_not: str, args: dict[str, Any]):
        self.ctrl, self.cls, self.why_not, self.args = ctrl, cls, why_not, args
        self.live: set[int] = set()
        self.ending: dict[int, float] = {}  # pid -> when it is killed unless it has exited

    def serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.ctrl, selectors.EVENT_READ)
        self.ctrl.sendall(RECORD.pack(READY, 0))
        try:
            while True:
                if sel.select(timeout=REAP_S):
                    record = self._read()
                    if record is None:
                        return
                    self._handle(*record, sel)
                self._reap()
        finally:
            for pid in list(self.live):
                self._kill(pid)

    def _read(self) -> tuple[bytes, int] | None:
        data = b""
        while len(data) < RECORD.size:
            chunk = self.ctrl.recv(RECORD.size - len(data))
            if not chunk:
                return None
            data += chunk
        return RECORD.unpack(data)

    def _handle(self, op: bytes, value: int, sel: selectors.BaseSelector) -> None:
        if op == FORK:
            self._fork(sel)
        elif op == END and value in self.live:
            self.ending[value] = time.monotonic() + CLOSE_GRACE_S
        elif op == KILL and value in self.live:
            self._kill(value)

    def _fork(self, sel: selectors.BaseSelector) -> None:
        ours, theirs = socket.socketpair()
        host = os.getpid()
        try:
            pid = os.fork()
        except OSError as err:
            ours.close()
            theirs.close()
            self.ctrl.sendall(RECORD.pack(FAILED, err.errno or 0))
            return
        if pid == 0:  # the episode's process
            code = 0
            try:
                sel.close()
                self.ctrl.close()
                theirs.close()
                os.setpgid(0, 0)
                _die_with_host(host)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                episode(ours, self.cls, self.why_not, self.args)
            except BaseException:  # noqa: BLE001 - the process ends here whatever happened
                code = 1
            finally:
                os._exit(code)
        ours.close()
        self.live.add(pid)
        socket.send_fds(self.ctrl, [RECORD.pack(FORK, pid)], [theirs.fileno()])
        theirs.close()

    def _kill(self, pid: int) -> None:
        for kill, target in ((os.killpg, pid), (os.kill, pid)):  # its group: what it started; else itself
            try:
                kill(target, signal.SIGKILL)
                break
            except OSError:
                continue
        self.ending.pop(pid, None)

    def _reap(self) -> None:
        while self.live:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            self.live.discard(pid)
            self.ending.pop(pid, None)
        now = time.monotonic()
        for pid, at in list(self.ending.items()):
            if now >= at:
                self._kill(pid)


def _load(payload: bytes) -> tuple[Any, str, dict[str, Any]]:
    """The environment's class (None, and why, when it does not import here) and its arguments; one instance
    is built and dropped, so that every episode's process starts with what building one imports and caches."""
    path, cls_bytes, args = pickle.loads(payload)
    sys.path[:] = path
    try:
        cls = pickle.loads(cls_bytes)
    except Exception as err:  # noqa: BLE001 - each episode says it: the environment cannot be imported
        return None, f"the environment's class cannot be imported in its process ({type(err).__name__}: {err})", args
    with contextlib.suppress(Exception):  # an instance that cannot be built: each episode's own build says why
        env = cls(**args)
        getattr(env, "close", lambda: None)()
        del env
    return cls, "", args


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the run, which then closes the host
    ctrl = socket.socket(fileno=int(sys.argv[1]))
    cls, why_not, args = _load(sys.stdin.buffer.read())
    Host(ctrl, cls, why_not, args).serve()


if __name__ == "__main__":
    main()
