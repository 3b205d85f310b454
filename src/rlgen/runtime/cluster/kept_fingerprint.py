"""What a run must share with a kept Ray cluster to take it over (runtime.cluster.kept_engines): the cluster's
workers start as its head did, in the folder, Python and environment of the run that started it, and its engines
run the rlgen code of that time. ``of_run`` takes this fingerprint when a cluster starts (about 10 ms: it hashes
rlgen's source); it is kept in the session's marker with the cluster key, and ``differs`` says, in the words of
one log line, what a later run does not share with it. Environment values are kept as digests only."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlgen.config import RunConfig
    from rlgen.types import JSONDict, JSONValue

# the variables compared besides those rlgen hands each actor: what decides how Python, the libraries and the
# GPUs behave in a worker; the rest of the environment (a shell's, a terminal's) is not compared
ENV_NAMES = frozenset({"PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "LD_LIBRARY_PATH", "LD_PRELOAD",
                       "VIRTUAL_ENV", "CONDA_PREFIX", "HOME", "TMPDIR", "LANG", "LC_ALL"})
ENV_PREFIXES = ("CUDA_", "NCCL_", "NVIDIA_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "VLLM_", "TORCH", "PYTORCH_",
                "TRITON_", "OMP_", "MKL_", "RAY_", "RLGEN_", "TOKENIZERS_", "DEEPSPEED_")
# set in the driver by rlgen (before a cluster starts: runtime.cluster.local_ray), Ray (by ray.init) and torch (as
# it loads, beside the cluster's start) themselves, from the settings compared above
ENV_SKIPPED = frozenset({"RAY_AUTH_MODE", "RAY_CLIENT_MODE", "TORCHINDUCTOR_CACHE_DIR"})
SOURCE_SUFFIXES = (".py", ".yaml")
PACKAGE = Path(__file__).resolve().parents[2]  # rlgen's folder


def _sha(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:16]


def source_hash(root: Path | None = None) -> str:
    """A hash of rlgen's source: every .py and .yaml file under the package, by relative path and content."""
    root = root or PACKAGE
    h = hashlib.sha1()
    for path in sorted(root.rglob("*")):
        if path.suffix in SOURCE_SUFFIXES and path.is_file():
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _env(actor_env: dict[str, str]) -> dict[str, str]:
    names = {k for k in os.environ if k in ENV_NAMES or k.startswith(ENV_PREFIXES)} - ENV_SKIPPED
    seen = {k: _sha(os.environ[k].encode()) for k in names}
    seen.update({f"actor:{k}": _sha(str(v).encode()) for k, v in actor_env.items()})
    return seen


def _module_file(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin and Path(spec.origin).is_file() else None


def _user_code(reward_specs: list[str], task_files: list[str]) -> dict[str, str]:
    """Each user reward module's source (a spec "module:function") by content; each task file by size and time."""
    seen: dict[str, str] = {}
    for spec in reward_specs:
        if ":" in spec:
            module = spec.partition(":")[0]
            origin = _module_file(module)
            seen[f"reward module {module}"] = _sha(Path(origin).read_bytes()) if origin else "not found"
    for name in task_files:
        path = Path(name).expanduser()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) if p.exists() else (str(p), None) for p in files]
        seen[f"task file {name}"] = _sha(repr(stats).encode())
    return seen


def take(actor_env: dict[str, str], reward_specs: list[str], task_files: list[str]) -> JSONDict:
    """This process's fingerprint: its working folder (path and identity), Python, rlgen's source, the environment
    variables that reach actors (actor_env: what rlgen hands each actor), and the user's reward modules and task
    files."""
    cwd = os.getcwd()
    st = os.stat(cwd)
    return {"cwd": cwd, "cwd_id": [st.st_dev, st.st_ino],
            "python": [sys.executable, sys.version],
            "rlgen": [str(PACKAGE), source_hash()],
            "env": _env(actor_env), "user": _user_code(reward_specs, task_files)}


def of_run(cfg: RunConfig, actor_env: dict[str, str]) -> JSONDict:
    """take() for a run of cfg, whose actors get actor_env."""
    task = cfg.task
    rewards = list(task.rewards) if task.rewards else [task.reward]
    return take(actor_env, rewards, [p for p in (task.path, task.eval_path) if p])


def _names(a: dict[str, str], b: dict[str, str]) -> str:
    changed = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    gone, new = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    parts = [f"{k} changed" for k in changed] + [f"{k} unset" for k in gone] + [f"{k} set" for k in new]
    return ", ".join(parts[:6]) + (f" and {len(parts) - 6} more" if len(parts) > 6 else "")


def _removed_under(pid: int | None) -> bool:
    """Whether the folder process pid works in was removed (Linux says so in /proc; a new folder at that path,
    even one that got the old one's inode number, is not where the process sits)."""
    if pid is None:
        return False
    try:
        return os.readlink(f"/proc/{int(pid)}/cwd").endswith(" (deleted)")
    except OSError:
        return False


def differs(kept: JSONValue, now: JSONDict, head_pid: int | None = None) -> str | None:
    """What the run with fingerprint ``now`` does not share with a cluster kept with fingerprint ``kept`` (whose
    head process, where given, shows the folder its workers start in), as the start of a sentence ("the kept Ray
    cluster ..."); None when it may be taken over."""
    if not isinstance(kept, dict) or not {"cwd", "cwd_id", "python", "rlgen", "env", "user"} <= kept.keys():
        return "the kept Ray cluster does not say what it was started with (an older rlgen kept it)"
    cwd = kept["cwd"]
    try:
        st = os.stat(cwd)
        same_folder = [st.st_dev, st.st_ino] == list(kept["cwd_id"])
    except OSError:
        return f"the kept Ray cluster was started from a folder that is gone ({cwd})"
    if not same_folder or _removed_under(head_pid):
        return f"the kept Ray cluster was started from a folder that was replaced since ({cwd})"
    if cwd != now["cwd"]:
        return f"the kept Ray cluster was started from another folder ({cwd}; this run: {now['cwd']})"
    if list(kept["python"]) != list(now["python"]):
        (exe, ver), (exe2, ver2) = kept["python"], now["python"]
        return (f"the kept Ray cluster runs another Python ({exe}, {ver.split()[0]}; this run: {exe2}, "
                f"{ver2.split()[0]})")
    if list(kept["rlgen"]) != list(now["rlgen"]):
        where, where2 = kept["rlgen"][0], now["rlgen"][0]
        why = (f"from {where}; this run's from {where2}" if where != where2
               else f"its source files in {where} changed since")
        return f"the kept Ray cluster runs other rlgen code ({why})"
    if kept["env"] != now["env"]:
        return f"the kept Ray cluster was started with other environment variables ({_names(kept['env'], now['env'])})"
    if kept["user"] != now["user"]:
        return f"the kept Ray cluster was started with other user code ({_names(kept['user'], now['user'])})"
    return None


__all__ = ["differs", "of_run", "source_hash", "take"]
