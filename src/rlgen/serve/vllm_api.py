"""The routes of vLLM's own server that RL trainers call (TRL's ``VLLMClient`` in server mode), with their meaning,
over rlgen's engines: the server's config and worker count, vLLM's NCCL weight transfer driven by the trainer
(``/init_weight_transfer_engine``, then per update ``/start_weight_update``, ``/update_weights`` and
``/finish_weight_update``), and ``/reset_prefix_cache``. Generation goes through the OpenAI routes, which take
vLLM's ``return_token_ids`` and ``return_tokens_as_token_ids``. The token, data-parallel spreading and policy
versions of `rlgen serve` hold on these routes too: each finished update is one new policy version."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from rlgen.serve.http import body, state
from rlgen.wire.protocol import BadRequest

TRANSFER_TIMEOUT_S = 300.0


def _world(pool: Any) -> int:
    return len(pool.engines) * int(pool.model.tensor_parallel_size)


LOGPROBS_MODE = "processed_logprobs"  # rlgen's engines report logprobs after temperature, as the RL ratio needs


async def server_info(request: Request) -> Any:
    """vLLM's config tree, as far as rlgen has its parts: model_config and parallel_config where vLLM keeps them
    (TRL reads model_config.logprobs_mode), and the same values flat for a quick look."""
    pool = state(request).pool
    m = pool.model
    model = {"model": m.path, "served_model_name": m.name, "max_model_len": m.max_model_len, "dtype": m.dtype,
             "logprobs_mode": LOGPROBS_MODE}
    parallel = {"tensor_parallel_size": m.tensor_parallel_size, "data_parallel_size": len(pool.engines)}
    return {"vllm_config": {**model, **parallel, "model_config": model, "parallel_config": parallel,
                            "weight_transfer_config": {"backend": "nccl"} if m.nccl_weights else None,
                            "engine_kind": m.engine_kind}}


async def get_world_size(request: Request) -> Any:
    return {"world_size": _world(state(request).pool)}


async def init_weight_transfer_engine(request: Request) -> Any:
    """The trainer's NCCL group: rank 0 is the trainer, then every worker of every engine, engine by engine."""
    pool = state(request).pool
    info = (await body(request)).get("init_info")
    if not isinstance(info, dict) or "rank_offset" not in info or "world_size" not in info:
        raise BadRequest("the body needs init_info with master_address, master_port, rank_offset and world_size.")
    if int(info["world_size"]) != _world(pool) + int(info["rank_offset"]):
        raise BadRequest(f"init_info.world_size={info['world_size']}, but this server has {_world(pool)} workers "
                         f"after rank_offset={info['rank_offset']}; ask GET /get_world_size.")
    tp = int(pool.model.tensor_parallel_size)
    results = await asyncio.gather(*(
        pool.init_weight_transfer({**info, "rank_offset": int(info["rank_offset"]) + k * tp}, TRANSFER_TIMEOUT_S, k)
        for k in range(len(pool.engines))))
    return {"success": True, "engines": len(results)}


async def start_weight_update(request: Request) -> Any:
    """One update begins: its version is the next one; engines that pause keep their running requests frozen."""
    pool = state(request).pool
    pool.pending_version = max(pool.versions) + 1
    if pool.model.pauses:
        await pool.pause(None)
    return {"success": True, "version": pool.pending_version}


async def update_weights(request: Request) -> Any:
    pool = state(request).pool
    info = (await body(request)).get("update_info")
    if not isinstance(info, dict) or not {"names", "dtype_names", "shapes"} <= set(info):
        raise BadRequest("the body needs update_info with names, dtype_names and shapes.")
    version = pool.pending_version or max(pool.versions) + 1
    return await pool.receive_weights(info, version, TRANSFER_TIMEOUT_S, None)


async def finish_weight_update(request: Request) -> Any:
    pool = state(request).pool
    version, pool.pending_version = pool.pending_version, None
    if any(pool.paused):
        await pool.resume(None)
    return {"success": True, "version": version if version is not None else max(pool.versions)}


async def reset_prefix_cache(request: Request) -> Any:
    pool = state(request).pool
    done = await asyncio.gather(*(pool.call(i, "reset_prefix_cache") for i in range(len(pool.engines))))
    return {"success": all(bool(d) for d in done)}


ROUTES = [
    ("GET", "/server_info", server_info),
    ("GET", "/get_world_size", get_world_size),
    ("POST", "/init_weight_transfer_engine", init_weight_transfer_engine),
    ("POST", "/start_weight_update", start_weight_update),
    ("POST", "/update_weights", update_weights),
    ("POST", "/finish_weight_update", finish_weight_update),
    ("POST", "/reset_prefix_cache", reset_prefix_cache),
]
