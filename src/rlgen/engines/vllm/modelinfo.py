"""vLLM's facts about a model class, found ahead of the engine.

Before its first start on a host, vLLM inspects the model's class (is it a text generator, does it take LoRA ...)
in a new Python process that imports vLLM for that alone, and keeps the answer under its cache folder
(``modelinfos/``). That took 19.5 s of a cold engine start on a fresh H100 host. rlgen starts the same inspection
at launch, in a process of its own beside the model folder and Ray's start, so the engine finds the answer in
the cache. Where the cache already has the class, nothing starts; where the inspection fails, the engine does it
as before. Nothing here imports vllm except the inspecting process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

_INSPECT_CODE = "import sys; from rlgen.engines.vllm.modelinfo import inspect_main; inspect_main(sys.argv[1:])"


def vllm_cache_root(env: Mapping[str, str]) -> Path:
    """vLLM's cache folder as vLLM 0.26 resolves it: VLLM_CACHE_ROOT, else XDG_CACHE_HOME/vllm, else ~/.cache/vllm."""
    if env.get("VLLM_CACHE_ROOT"):
        return Path(env["VLLM_CACHE_ROOT"]).expanduser()
    return Path(env.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "vllm"


def cached(architecture: str, env: Mapping[str, str]) -> bool:
    """Whether vLLM's cache holds an inspection of this architecture's class (vLLM itself checks it is current)."""
    return any((vllm_cache_root(env) / "modelinfos").glob(f"*-{architecture}.json"))


def start_inspection(architectures: list[str], engine_env: Mapping[str, str]) -> subprocess.Popen | None:
    """Start inspecting the classes of ``architectures`` that vLLM's cache lacks, in the background, with the
    engines' environment; None when there is nothing to do."""
    env = {**os.environ, **{k: str(v) for k, v in engine_env.items()}}
    todo = [a for a in architectures if a and not cached(a, env)]
    if not todo:
        return None
    try:
        return subprocess.Popen([sys.executable, "-c", _INSPECT_CODE, *todo], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None


def inspect_main(architectures: list[str]) -> None:
    """The inspecting process: vLLM's own inspection of each class, run here (vLLM would start yet another process
    for it, to keep CUDA out of its engine's process; this one never uses CUDA), which stores it in the cache."""
    try:
        from vllm.model_executor.models import registry
    except ImportError:
        return
    registry._run_in_subprocess = lambda fn: fn()  # noqa: SLF001 - this process is the subprocess
    for arch in architectures:
        try:
            registry.ModelRegistry._try_inspect_model_cls(arch)  # noqa: SLF001 - vLLM 0.26's cached inspection
        except Exception:  # noqa: BLE001 - the engine inspects it itself
            pass


__all__ = ["cached", "inspect_main", "start_inspection", "vllm_cache_root"]
