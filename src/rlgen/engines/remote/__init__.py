"""engine=remote: the engines of a running `rlgen serve`. The run starts one small proxy actor per server engine
(``engine.RemoteEngine``) beside its learners; the plan reads the server's engines, TP size and lengths
(``plan.with_server``), and weights go over HTTP or, from learners on GPUs to a server that takes them, over
NCCL; LoRA adapters go over HTTP to a server whose engines take them."""

from __future__ import annotations

from typing import Any

from rlgen.config import RunConfig, Transport, WeightsOver
from rlgen.engines.registry import EngineSpec
from rlgen.engines.remote.plan import with_server


def _transport(colocated: bool, cfg: RunConfig) -> Transport:
    return Transport.nccl if cfg.engine.weights_over == WeightsOver.nccl else Transport.http


def _actor_kwargs(cfg: RunConfig, transport: Transport, env: dict[str, str]) -> dict[str, Any]:
    return {"timeout_s": cfg.timeout_s}


ENGINE = EngineSpec(
    kind="remote",
    actor="rlgen.engines.remote.engine:RemoteEngine",
    starting="a remote engine's proxy asks the rlgen server at engine.url for its engine and its health",
    served=True,
    passes_env=True,  # engine.env reaches the proxies and its NCCL_* the learners: with_server sets the server's
    adapters=True,  # when the server's engines take them (its /info max_lora_rank, read by the plan)
    receives_nccl=True,  # from learners on GPUs, when the server's engines take it (engine.weights_over=nccl)
    transport=_transport,
    actor_kwargs=_actor_kwargs,
    resolve=with_server,
)
