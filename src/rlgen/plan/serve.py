"""`rlgen serve`'s plan: every GPU of the hardware (or one CPU each) for serve.data_parallel engines of TP
engine.tensor_parallel_size, no learners. Built from the same pieces as a training plan, so the same checks
apply; a problem stops the server before it starts, with its fix."""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import math

from rlgen.config import RunConfig, ServeConfig, Setting, set_key
from rlgen.learners.registry import resolve_learner
from rlgen.plan.build import count_params, layout_of, model_summary, spec_of, transport_of
from rlgen.plan.checks.spanning import check_engine_floor, hardware_problems, live_vllm_env
from rlgen.plan.checks.values import check_values
from rlgen.plan.context import positions
from rlgen.plan.determinism import resolve_determinism
from rlgen.plan.model_folder import with_model_folder
from rlgen.plan.precision import resolve_precision
from rlgen.plan.recipes import fill_recipe
from rlgen.plan.resolved import BatchGeometry, Layout, Plan, PlanError
from rlgen.plan.slots import place_engines
from rlgen.wire.protocol import TOKEN_ENV


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


COUNTS = ("data_parallel", "max_sequences", "max_queue")  # whole numbers of at least 1
AMOUNTS = ("max_body_mb", "request_timeout_s", "body_timeout_s", "header_timeout_s")  # positive and finite


def _check_limits(s: ServeConfig, p: list[str]) -> None:
    """Each of the server's numeric settings in its range, named alone with a value the command line takes."""
    default = ServeConfig()
    if not 1 <= s.port <= 65535:
        p.append(f"serve.port={s.port} is not a TCP port; choose one in 1..65535, such as serve.port={default.port}.")
    for key in COUNTS:
        if getattr(s, key) < 1:
            p.append(f"serve.{key}={getattr(s, key)} must be at least 1, such as serve.{key}={getattr(default, key)} "
                     "(the default).")
    for key in AMOUNTS:
        if not 0 < getattr(s, key) < math.inf:
            p.append(f"serve.{key}={getattr(s, key):g} must be a finite number above 0, such as "
                     f"serve.{key}={getattr(default, key):g} (the default).")


def _token_problem(cfg: RunConfig, token: str | None) -> str | None:
    """A sentence for a token of only whitespace: no client could send it, so every request would get 401."""
    if token is None or token.strip():
        return None
    if cfg.serve.token:
        return ("serve.token is blank (only whitespace), and no client could send it; set serve.token=<a secret>, "
                "or leave it out.")
    return (f"{TOKEN_ENV} is set but blank (only whitespace), and no client could send it; set "
            f"{TOKEN_ENV}=<a secret>, or unset it to serve on 127.0.0.1 without a token.")


def check_serve_values(cfg: RunConfig, token: str | None, p: list[str]) -> None:
    s = cfg.serve
    _check_limits(s, p)
    blank = _token_problem(cfg, token)
    if blank:
        p.append(blank)
    elif not is_loopback(s.host) and not token:
        p.append(f"serve.host={s.host} lets other machines reach the server, which then needs a bearer token: set "
                 "RLGEN_SERVE_TOKEN=<a secret> in the environment (or serve.token=), or bind serve.host=127.0.0.1.")
    if spec_of(cfg).served:
        p.append(f"engine={cfg.engine.kind} uses a server rlgen serve started elsewhere; serve engine=hf or "
                 "engine=vllm here.")
    rank = cfg.engine.max_lora_rank
    if rank and rank > 0 and not spec_of(cfg).adapters:
        p.append(f"engine.max_lora_rank={rank}: engine={cfg.engine.kind} takes no LoRA adapters; leave it unset.")
    elif rank and not spec_of(cfg).adapter_room and importlib.util.find_spec("peft") is None:
        p.append("LoRA adapters on hf engines need the peft package, which is not installed: pip install 'rlgen[lora]'.")


def served_adapters(cfg: RunConfig, spec) -> tuple[bool, int | None]:
    """(whether the server's engines take LoRA adapters, the largest rank; None: any). Engines that set room
    aside at start take them up to engine.max_lora_rank when it is set; the others (hf) whenever peft is there,
    up to engine.max_lora_rank when set."""
    rank = cfg.engine.max_lora_rank
    if not spec.adapters or rank == 0 or (spec.adapter_room and not rank):
        return False, 0
    if not spec.adapter_room and importlib.util.find_spec("peft") is None:
        return False, 0
    return True, rank


def build_serve_plan(cfg: RunConfig, token: str | None = None) -> Plan:
    """The engines `rlgen serve` starts. Raises PlanError listing every problem with its fix."""
    p: list[str] = []
    check_serve_values(cfg, token, p)
    p.extend(hardware_problems(cfg))
    if p:
        raise PlanError(p)
    spec = spec_of(cfg)
    cfg, settings = _serve_config(with_model_folder(cfg), spec)
    check_values(cfg, p)
    _check_serve_shape(cfg, p)
    if p:
        raise PlanError(p)
    cfg = set_key(cfg, "engine.engines_per_gpu", 1)  # a server's engines have their GPUs to themselves
    engines = place_engines(cfg, spec, Layout.split, p)
    ms = model_summary(cfg)
    if positions(cfg.model) < cfg.engine.max_model_len:
        p.append(f"engine.max_model_len={cfg.engine.max_model_len} is over model {cfg.model.name}'s "
                 f"{positions(cfg.model)} positions; lower it.")
    check_engine_floor(cfg, spec, ms, p)
    cfg, _ = resolve_precision(cfg, p)  # the engines' dtype, from precision where engine.dtype is null
    if p:
        raise PlanError(p)
    cfg, determinism = resolve_determinism(cfg, spec)
    env, dropped = live_vllm_env(cfg.engine.env) if spec.passes_env else ({}, [])
    device = "cuda" if cfg.hardware.gpus_per_node else "cpu"
    layout = layout_of(cfg, spec)
    share = cfg.engine.gpu_memory_utilization if spec.memory_share and device == "cuda" else None
    return Plan(
        config=cfg, engine=spec, learner_kind=resolve_learner(cfg.learner.kind, device).kind, layout=layout,
        device=device, hardware=cfg.hardware.name, nodes=cfg.hardware.nodes, gpus_per_node=cfg.hardware.gpus_per_node,
        engines=tuple(dataclasses.replace(e, memory_share=share) for e in engines), learners=(),
        transport=transport_of(cfg, spec, layout), batch=BatchGeometry(0, 0, 0, 0, 0, 0, 0, cfg.engine.max_model_len),
        model=ms, async_steps=0, engine_env=env, warnings=tuple(dropped + determinism),
        settings=tuple(settings + [Setting("engine.num_engines", cfg.serve.data_parallel, "serve.data_parallel")]),
    )


def _serve_config(cfg: RunConfig, spec) -> tuple[RunConfig, list[Setting]]:
    """The server's engines on every GPU of the hardware: no learners, no colocation; max_model_len the model's
    positions and, for engines that take a share of their GPU, their own default share when unset."""
    cfg, _ = fill_recipe(cfg, count_params(cfg.model)[0])  # the algo values check_values reads; unused here
    hw, e = cfg.hardware, cfg.engine
    settings: list[Setting] = []
    total = hw.nodes * hw.gpus_per_node
    for key, value in (("engine.num_engines", cfg.serve.data_parallel), ("engine.colocate", False),
                       ("hardware.colocated", False), ("hardware.engine_gpus", total), ("hardware.learner_gpus", 0)):
        cfg = set_key(cfg, key, value)
    if e.max_model_len is None:
        cfg = set_key(cfg, "engine.max_model_len", positions(cfg.model))
        settings.append(Setting("engine.max_model_len", positions(cfg.model),
                                "derived: model.max_position_embeddings (times model.yarn_factor)"))
    if total and spec.memory_share:
        share = e.gpu_memory_utilization or spec.default_memory_share
        settings.append(Setting("engine.gpu_memory_utilization", share, "config" if e.gpu_memory_utilization else
                                "derived: engines have their GPUs (the engine's default share)"))
        cfg = set_key(cfg, "engine.gpu_memory_utilization", share)
    return cfg, settings


def _check_serve_shape(cfg: RunConfig, p: list[str]) -> None:
    hw, tp = cfg.hardware, cfg.engine.tensor_parallel_size
    total = hw.nodes * hw.gpus_per_node
    if total and cfg.serve.data_parallel * tp > total:
        p.append(f"serve.data_parallel={cfg.serve.data_parallel} engines of engine.tensor_parallel_size={tp} need "
                 f"{cfg.serve.data_parallel * tp} GPUs, and hardware={hw.name} has {total}; lower one of them.")
    elif cfg.engine.engines_per_gpu not in (None, 1):
        p.append(f"rlgen serve runs one engine per GPU group (serve.data_parallel of them), and engine.engines_per_gpu="
                 f"{cfg.engine.engines_per_gpu} is for training runs; set engine.engines_per_gpu=1.")
