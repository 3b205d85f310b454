"""A sandboxed Python tool: the policy's code runs in a subprocess of its own, in a fresh folder, with limits.

- **Time**: a wall-clock bound (the process group is killed after it) and a CPU-time limit.
- **Memory**: an address-space limit; also a cap on file sizes and open files.
- **No network**: where the kernel lets an unprivileged process make namespaces, the child gets a network
  namespace of its own with no interfaces. Either way an audit hook, which Python code cannot remove, refuses
  sockets, starting processes, loading C libraries through ctypes, and writing outside the folder.
- **Its own folder**: a new temporary directory per call, the working directory, removed after; ``python -I``
  ignores the environment's PYTHONPATH and the user's site packages, and the child gets a bare environment.
"""

from __future__ import annotations

import ctypes
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rlgen.tasks.base import Prompt
from rlgen.tasks.envs import register_env
from rlgen.tasks.envs.tools import MAX_RESULT_CHARS, ToolEnv, text_tool_schema

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: the child between fork and exec only calls it

# Runs first in the child: the hook stays for the life of the interpreter (sys.addaudithook cannot be undone).
GUARD = """
import os, sys
_here = os.path.realpath(os.getcwd())
_refused = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
            "os.forkpty", "pty.", "ctypes.", "_ctypes.")
def _hook(event, args):
    if event.startswith(_refused):
        raise PermissionError(f"the sandbox refuses {event}")
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    if event == "open" and (any(c in str(args[1]) for c in "wax+") if args[1] is not None else args[2] & writes):
        path = os.path.realpath(os.fsdecode(args[0])) if isinstance(args[0], (str, bytes)) else ""
        if path and not path.startswith(_here + os.sep):
            raise PermissionError(f"the sandbox writes only in its own folder, not {path}")
sys.addaudithook(_hook)
del _hook
__file__ = "main.py"
exec(compile(open("main.py").read(), "main.py", "exec"), {"__name__": "__main__"})
"""


def _limits(memory_mb: int, cpu_s: int) -> Any:
    def apply() -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 2**20, 16 * 2**20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        _LIBC.unshare(CLONE_NEWUSER | CLONE_NEWNET)  # fails quietly where not allowed: the audit hook still refuses
        #                                               sockets

    return apply


def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 512) -> str:
    """Run code with ``python -I`` in a fresh folder under the limits above; its output (stdout then stderr), or
    what stopped it."""
    folder = Path(tempfile.mkdtemp(prefix="rlgen-sandbox-"))
    try:
        (folder / "main.py").write_text(str(code))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        proc = subprocess.Popen([sys.executable, "-I", "-B", "-c", GUARD], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_limits(int(memory_mb), int(timeout_s) + 1))
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return f"error: the code ran longer than {timeout_s:g} s and was stopped"
        text = out.decode(errors="replace") + err.decode(errors="replace")
        if proc.returncode < 0:
            text += f"\n(killed by signal {-proc.returncode}: a time or memory limit)"
        return text.strip()[-MAX_RESULT_CHARS:] or "(no output)"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


run_python.schema = text_tool_schema("run_python", "Run a Python program and return what it prints.", "code")  # type: ignore[attr-defined]


@register_env("python")
class PythonEnv(ToolEnv):
    """Questions a short program answers, with a sandboxed ``run_python`` tool: its own prompts, or rows from
    task.path; ``timeout_s`` and ``memory_mb`` bound each run."""

    def __init__(self, reward: str = "last_number", max_calls: int = 4, timeout_s: float = 5.0,
                 memory_mb: int = 512):
        super().__init__(reward, max_calls)
        self.tools = {"run_python": lambda code: run_python(code, timeout_s, memory_mb)}
        self.tools["run_python"].schema = run_python.schema  # type: ignore[attr-defined]

    def draw(self, rng: random.Random, n: int) -> list[Prompt]:
        out = []
        for _ in range(n):
            top, k = rng.randrange(10, 200), rng.randrange(2, 4)
            out.append(Prompt(f"What is the sum of i**{k} for i from 1 to {top}? Write a program with the "
                              "run_python tool, then give the number.", str(sum(i**k for i in range(1, top + 1)))))
        return out
