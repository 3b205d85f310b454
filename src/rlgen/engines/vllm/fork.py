"""How an engine actor starts vLLM's engine-core process: by fork where it safely can, else by spawn.

A spawned engine core imports vLLM, torch and the model code all over again; a forked one has them already.
vLLM spawns inside any Ray actor, but rlgen's engine actor forks when ``VLLM_WORKER_MULTIPROC_METHOD`` is
``fork`` (the default), this process has not initialized CUDA, and the engine is a Ray actor. Under tensor
parallelism the forked engine core then forks its GPU workers too, since it has not touched CUDA either. A
forked start that fails is started again by spawn (``FORK_FAILED``). docs/startup.md says why each condition
is needed. No vllm import at module level.
"""

from __future__ import annotations

import os

FORK, SPAWN = "fork", "spawn"
METHOD_VAR = "VLLM_WORKER_MULTIPROC_METHOD"
FORK_FAILED = "Cannot re-initialize CUDA in forked subprocess"  # torch's words, in the engine core's output


def fork_allowed(cuda_initialized: bool, in_actor: bool) -> bool:
    return os.environ.get(METHOD_VAR, FORK) == FORK and not cuda_initialized and in_actor


def choose_core_start() -> str:
    """Set up how vLLM will start this engine's core process, and return which method that is."""
    import torch
    from vllm.ray.lazy_utils import is_in_ray_actor

    if not fork_allowed(torch.cuda.is_initialized(), is_in_ray_actor()):
        os.environ[METHOD_VAR] = SPAWN
        return SPAWN
    from vllm.utils import system_utils

    # vLLM 0.26 decides in system_utils._maybe_force_spawn, where being in a Ray actor is one reason to spawn.
    # Only that reason is taken away, in this process and so in the engine core forked from it, which starts
    # the TP workers.
    system_utils.is_in_ray_actor = lambda: False
    os.environ[METHOD_VAR] = FORK
    return FORK


def spawn_from_now() -> str:
    """After a forked start failed: vLLM spawns this engine's core from now on."""
    os.environ[METHOD_VAR] = SPAWN
    return SPAWN


__all__ = ["FORK", "FORK_FAILED", "SPAWN", "choose_core_start", "fork_allowed", "spawn_from_now"]
