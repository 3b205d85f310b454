"""engine=remote's part of the plan: what the run needs to know of the server at engine.url (its /info), read once
when the plan is built, and the checks that the server can serve this run: it answers, it serves the same model,
its max_model_len holds a prompt and its response, and it takes weights the way the run sends them. No torch or
Ray import."""

from __future__ import annotations

import os
from typing import Any

from rlgen.config import RunConfig, Setting, WeightsOver, set_key
from rlgen.wire.client import GenerationClient, ServerError
from rlgen.wire.protocol import TOKEN_ENV

INFO_TIMEOUT_S = 10.0


def fetch_info(url: str, token: str | None, timeout_s: float = INFO_TIMEOUT_S) -> dict[str, Any]:
    """The server's /info; raises ServerError with one sentence when there is no good answer."""

    with GenerationClient(url, token=token, timeout_s=timeout_s) as client:
        return client.info()


def with_server(cfg: RunConfig, params: int, vocab: int, p: list[str]) -> tuple[RunConfig, list[Setting]]:
    """cfg with the server's engine count, TP size, max_model_len and weight path filled in (each a Setting
    whose source is the server); problems go to p."""

    e = cfg.engine
    if not e.url:
        p.append("engine=remote needs the address of a running server: set engine.url=http://HOST:PORT (start one "
                 "with `rlgen serve`).")
        return cfg, []
    try:
        info = fetch_info(e.url, e.token or os.environ.get(TOKEN_ENV))
    except ServerError as err:
        if err.status == 401:
            p.append(f"the server at {e.url} wants a bearer token: set {TOKEN_ENV} (or engine.token) to its token.")
        else:
            p.append(f"{err}")
        return cfg, []
    source = f"server {e.url}"
    if int(info["params"]) != params or int(info["vocab_size"]) != vocab:
        p.append(f"the server at {e.url} serves {info['model']} ({int(info['params']):,} parameters, vocabulary "
                 f"{int(info['vocab_size']):,}), but this run trains model {cfg.model.name} ({params:,}, {vocab:,}); "
                 "start the server with the same model= (or model.path=), or point engine.url at one that has it.")
        return cfg, []
    settings = []
    if e.num_engines is None:
        cfg = set_key(cfg, "engine.num_engines", int(info["data_parallel"]))
        settings.append(Setting("engine.num_engines", int(info["data_parallel"]), f"{source} (its data_parallel)"))
    elif e.num_engines > int(info["data_parallel"]):
        p.append(f"engine.num_engines={e.num_engines}, but the server at {e.url} has {info['data_parallel']} engines; "
                 "leave engine.num_engines unset to use all of them.")
    cfg = set_key(cfg, "engine.tensor_parallel_size", int(info["tensor_parallel_size"]))
    settings.append(Setting("engine.tensor_parallel_size", int(info["tensor_parallel_size"]), source))
    if e.max_model_len is None or e.max_model_len > int(info["max_model_len"]):
        cfg = set_key(cfg, "engine.max_model_len", int(info["max_model_len"]))
        settings.append(Setting("engine.max_model_len", int(info["max_model_len"]), source))
    if info.get("dtype") and info["dtype"] != cfg.engine.dtype:  # weights go in the dtype its engines hold
        cfg = set_key(cfg, "engine.dtype", str(info["dtype"]))
        settings.append(Setting("engine.dtype", str(info["dtype"]), source))
    room = info.get("max_lora_rank", 0)  # the adapters its engines take: 0 none, null any rank
    cfg = set_key(cfg, "engine.max_lora_rank", None if room is None else int(room))
    settings.append(Setting("engine.max_lora_rank", room, f"{source} (0: it takes no LoRA adapters)"))
    over = e.weights_over
    gpus = cfg.hardware.gpus_per_node > 0
    nccl = "nccl" in info.get("weights_over", ())  # the server's engines take vLLM's NCCL weight transfer
    if over == WeightsOver.auto:
        over = WeightsOver.nccl if gpus and nccl else WeightsOver.http
        why = ("learners on GPUs, server engines take NCCL" if over == WeightsOver.nccl
               else "CPU learners, or server engines that take weights over HTTP only")
        settings.append(Setting("engine.weights_over", over.value, f"derived: {why}"))
    elif over == WeightsOver.nccl and (not gpus or not nccl):
        p.append(f"engine.weights_over=nccl needs learners on GPUs and a server whose engines take NCCL weight "
                 f"transfer (this one runs {info['engine_kind']} engines, hardware={cfg.hardware.name}); use "
                 "engine.weights_over=http.")
    cfg = set_key(cfg, "engine.weights_over", over)
    server_nccl = {str(k): str(v) for k, v in (info.get("nccl_env") or {}).items()}
    if over == WeightsOver.nccl and server_nccl:  # NCCL's two ends must agree, or the learner's join fails
        env = {**cfg.engine.env, **server_nccl}
        cfg = set_key(cfg, "engine.env", env)
        settings.append(Setting("engine.env", env, f"{source} (the NCCL settings its engines run with, which the "
                                "learners take too)"))
    return cfg, settings
