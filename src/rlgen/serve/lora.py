"""LoRA adapters on `rlgen serve`: named adapters loaded from folders on the server's machine and unloaded by name
(``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``, the routes vLLM's OpenAI server has), which
requests then use by name (``"adapter"`` in a /generate request, ``"model"`` in /v1/completions); and the policy
adapter a trainer sends each version (``POST /weights/adapter``, safetensors with the adapter's config in the
metadata), which requests that name no adapter use.

A server takes adapters when its engines do (``ServedModel.adapters``): vllm engines started with
engine.max_lora_rank, hf engines with peft installed. Every adapter is checked against the served model before
an engine sees it, so a wrong one gets one sentence and changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from rlgen.adapter_folder import read_adapter_config
from rlgen.plan.lora import adapter_misfit
from rlgen.serve.http import failure
from rlgen.serve.pool import EnginePool
from rlgen.wire.protocol import BadRequest


def _check_takes(pool: EnginePool, rank: int | None = None) -> None:
    m = pool.model
    if not m.adapters:
        raise BadRequest(f"this server's {m.engine_kind} engines were started without LoRA; restart `rlgen serve` with "
                         f"engine.max_lora_rank={rank or 64} (or more) to load adapters.", status=409)
    if rank is not None and m.max_lora_rank is not None and rank > m.max_lora_rank:
        raise BadRequest(f"the adapter has rank {rank}, over this server's engine.max_lora_rank={m.max_lora_rank}; "
                         f"restart `rlgen serve` with engine.max_lora_rank={rank} or more.", status=400)


def _folder_rank(path: str) -> int:
    config, why = read_adapter_config(path)
    if why:
        raise BadRequest(f"lora_path={path} on the server's machine {why}.", status=400)
    try:
        return int(config.get("r") or 0)
    except (TypeError, ValueError) as err:
        raise BadRequest(f"lora_path={path}: adapter_config.json has no whole-number rank r ({err}).") from err


def _check_fits(pool: EnginePool, path: str) -> None:
    if pool.model.config is not None and (why := adapter_misfit(pool.model.config, path)):
        raise BadRequest(f"lora_path={path} {why}", status=400)


async def load_named(pool: EnginePool, name: str, path: str, inplace: bool = False) -> dict[str, Any]:
    """Load the adapter folder at path under ``name`` into every engine; one that fails undoes the others."""
    if name in (pool.model.name, pool.model.path):
        raise BadRequest(f"lora_name={name!r} is the served model's own name; choose another.")
    rank = _folder_rank(path)
    _check_takes(pool, rank)
    _check_fits(pool, path)
    if name in pool.adapters:
        if not inplace:
            raise BadRequest(f"an adapter named {name!r} is loaded already; unload it first, pick another name, or "
                             "send load_inplace=true to replace it.")
        await unload_named(pool, name)
    indices = list(range(len(pool.engines)))
    results = await asyncio.gather(*(pool.call(i, "add_adapter", name, path) for i in indices), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        done = [i for i, r in zip(indices, results) if not isinstance(r, BaseException)]
        await asyncio.gather(*(pool.call(i, "remove_adapter", name) for i in done), return_exceptions=True)
        raise BadRequest(f"the engines could not load adapter {name!r}: {failure(failed[0])}", status=400)
    pool.adapters[name] = path
    return {"loaded": name, "adapters": sorted(pool.adapters)}


async def unload_named(pool: EnginePool, name: str) -> dict[str, Any]:
    if name not in pool.adapters:
        raise pool.no_adapter(name)
    await asyncio.gather(*(pool.call(i, "remove_adapter", name) for i in range(len(pool.engines))))
    del pool.adapters[name]
    return {"unloaded": name, "adapters": sorted(pool.adapters)}


async def update_policy(pool: EnginePool, adapter: dict[str, Any], version: int, engine: int | None) -> dict[str, Any]:
    """The trainer's adapter at ``version`` becomes the policy of the picked engines."""
    _check_takes(pool, int(adapter["config"].get("r") or 0))
    picked = pool.awake(engine, "an adapter")
    results = await asyncio.gather(*(pool.call(i, "load_adapter", adapter, int(version)) for i in picked))
    return pool.updated(picked, list(results), version)
