"""`rlgen serve`'s plan: every GPU of the hardware (or one CPU each) for serve.data_parallel engines of TP
engine.tensor_parallel_size, no learners. Built from the same pieces as a training plan, so the same checks
apply; a problem stops the server before it starts, with its fix."""

from __future__ import annotations

import ipaddress

from rlgen.config import EngineKind, RunConfig, Setting, set_key
from rlgen.plan.build import (
    BatchGeometry,
    Plan,
    PlanError,
    Transport,
    _model_summary,
    _place_engines,
    check_engine_floor,
    count_params,
    live_vllm_env,
)
from rlgen.plan.memory import ENGINE_MAX_SHARE
from rlgen.plan.model_folder import with_model_folder
from rlgen.plan.recipes import fill_recipe
from rlgen.plan.values import check_values


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_serve_values(cfg: RunConfig, token: str | None, p: list[str]) -> None:
    s = cfg.serve
    if not 1 <= s.port <= 65535:
        p.append(f"serve.port={s.port} is not a TCP port; choose one in 1..65535.")
    if s.data_parallel < 1:
        p.append(f"serve.data_parallel={s.data_parallel} must be at least 1.")
    if s.max_sequences < 1 or s.max_body_mb <= 0 or s.request_timeout_s <= 0:
        p.append("serve.max_sequences, serve.max_body_mb and serve.request_timeout_s must be positive.")
    if not is_loopback(s.host) and not token:
        p.append(f"serve.host={s.host} lets other machines reach the server, which then needs a bearer token: set "
                 "RLGEN_SERVE_TOKEN=<a secret> in the environment (or serve.token=), or bind serve.host=127.0.0.1.")
    if cfg.engine.kind == EngineKind.remote:
        p.append("engine=remote uses a server rlgen serve started elsewhere; serve engine=hf or engine=vllm here.")


def build_serve_plan(cfg: RunConfig, token: str | None = None) -> Plan:
    """The engines `rlgen serve` starts. Raises PlanError listing every problem with its fix."""
    p: list[str] = []
    check_serve_values(cfg, token, p)
    if p:
        raise PlanError(p)
    cfg = with_model_folder(cfg)
    cfg, _ = fill_recipe(cfg, count_params(cfg.model)[0])  # the algo values check_values reads; unused here
    hw, e = cfg.hardware, cfg.engine
    settings: list[Setting] = []
    total = hw.nodes * hw.gpus_per_node
    cfg = set_key(cfg, "engine.num_engines", cfg.serve.data_parallel)
    cfg = set_key(cfg, "engine.colocate", False)
    cfg = set_key(cfg, "hardware.colocated", False)
    cfg = set_key(cfg, "hardware.engine_gpus", total)
    cfg = set_key(cfg, "hardware.learner_gpus", 0)
    if e.max_model_len is None:
        cfg = set_key(cfg, "engine.max_model_len", cfg.model.max_position_embeddings)
        settings.append(Setting("engine.max_model_len", cfg.model.max_position_embeddings,
                                "derived: model.max_position_embeddings"))
    if total and e.kind == EngineKind.vllm:
        share = e.gpu_memory_utilization or ENGINE_MAX_SHARE
        settings.append(Setting("engine.gpu_memory_utilization", share,
                                "config" if e.gpu_memory_utilization else "derived: engines have their GPUs (vLLM's default)"))
        cfg = set_key(cfg, "engine.gpu_memory_utilization", share)
    check_values(cfg, p)
    tp = cfg.engine.tensor_parallel_size
    if total and cfg.serve.data_parallel * tp > total:
        p.append(f"serve.data_parallel={cfg.serve.data_parallel} engines of engine.tensor_parallel_size={tp} need "
                 f"{cfg.serve.data_parallel * tp} GPUs, and hardware={hw.name} has {total}; lower one of them.")
        raise PlanError(p)
    if cfg.engine.engines_per_gpu != 1:
        p.append(f"rlgen serve runs one engine per GPU group (serve.data_parallel of them), and engine.engines_per_gpu="
                 f"{cfg.engine.engines_per_gpu} is for training runs; set engine.engines_per_gpu=1.")
        raise PlanError(p)
    engines = _place_engines(cfg, False, p)
    ms = _model_summary(cfg)
    if cfg.model.max_position_embeddings < cfg.engine.max_model_len:
        p.append(f"engine.max_model_len={cfg.engine.max_model_len} is over model {cfg.model.name}'s "
                 f"max_position_embeddings={cfg.model.max_position_embeddings}; lower it.")
    check_engine_floor(cfg, ms, p)
    if p:
        raise PlanError(p)
    env, dropped = live_vllm_env(cfg.engine.env) if cfg.engine.kind == EngineKind.vllm else ({}, [])
    transport = Transport.nccl if total and cfg.engine.kind == EngineKind.vllm else Transport.ray_object_store
    length = cfg.engine.max_model_len
    return Plan(
        engine_kind=cfg.engine.kind.value, device="cuda" if total else "cpu", hardware=hw.name, nodes=hw.nodes,
        gpus_per_node=hw.gpus_per_node, engines=engines, learners=(), colocated=False, transport=transport,
        batch=BatchGeometry(0, 0, 0, 0, 0, 0, 0, length), model=ms, async_steps=0, engine_env=env,
        warnings=tuple(dropped), settings=tuple(settings + [Setting("engine.num_engines", cfg.serve.data_parallel,
                                                                    "serve.data_parallel")]),
    )
