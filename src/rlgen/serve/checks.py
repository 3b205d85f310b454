"""What stops `rlgen serve` before it starts an engine: the serve plan's problems, GPUs and packages this
machine lacks, a port that cannot be bound, and the bearer token the server wants."""

from __future__ import annotations

import os
import socket
from typing import Any

from rlgen.config import RunConfig
from rlgen.plan import PlanError
from rlgen.plan.checks.machine import cluster_address, engine_package_problem, local_gpus
from rlgen.plan.serve import build_serve_plan
from rlgen.wire.protocol import TOKEN_ENV


def serve_token(cfg: RunConfig) -> str | None:
    return cfg.serve.token or os.environ.get(TOKEN_ENV) or None


def port_problem(host: str, port: int) -> str | None:
    """A sentence when (host, port) cannot be bound now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            return f"cannot listen on {host}:{port} ({err.strerror}); choose another serve.port, or stop what uses it."
    return None


def serve_problems(cfg: RunConfig) -> tuple[Any, list[str]]:
    """(the server's plan, or None; everything that stops `rlgen serve` before it starts an engine)."""

    try:
        plan = build_serve_plan(cfg, serve_token(cfg))
    except PlanError as err:
        return None, err.problems
    problems = []
    need = sum(len(e.gpus) for e in plan.engines)
    if need and not cluster_address(cfg) and local_gpus() < need:
        problems.append(f"the server's engines need {need} GPU(s) and this machine has {local_gpus()}; lower "
                        "serve.data_parallel or engine.tensor_parallel_size, or serve engine=hf hardware=cpu.")
    engine_package_problem(plan, "serve engine=hf", problems)
    bind = port_problem(cfg.serve.host, cfg.serve.port)
    return plan, problems + ([bind] if bind else [])
