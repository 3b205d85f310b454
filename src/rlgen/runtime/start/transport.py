"""The run's weight transport, from its plan: the path ``plan.transport`` names, once the engine kind claims the
capability that path calls (``rlgen.engines.contract``), with the engines' seats and sleep the plan decided.
The transports themselves, and everything else of weight sync, are ``rlgen.sync``."""

from __future__ import annotations

from rlgen.config import RunConfig, Transport
from rlgen.engines.contract import PausesInFlight, PolicyAdapters, ReceivesIpc, ReceivesNccl, has, require
from rlgen.plan import Plan
from rlgen.sync.layout import DEFAULT_BUCKET_BYTES
from rlgen.sync.transports import (
    AdapterTransport,
    CudaIpcTransport,
    NcclTransport,
    ObjectStoreTransport,
    TransportBase,
)


def make_transport(plan: Plan, cfg: RunConfig, *, bucket_mb: float | None = None,
                   sleep_level: int = 1) -> TransportBase:
    """The transport for plan.transport, once the engine kind claims the capability it calls. cfg is the RunConfig
    (timeout_s); the weights go in the engines' dtype as the plan resolved it (plan.config.engine.dtype, from
    precision where engine.dtype is null); an update waits at most runtime.hang_timeout_s where that is shorter."""
    bucket = int(bucket_mb * 2**20) if bucket_mb else DEFAULT_BUCKET_BYTES
    kwargs = {"timeout_s": min(cfg.timeout_s, cfg.runtime.hang_timeout_s), "dtype": str(plan.config.engine.dtype),
              "bucket_bytes": bucket, "tp_sizes": [e.tensor_parallel_size for e in plan.engines]}
    transport: TransportBase
    if plan.transport is Transport.nccl:
        require(plan.engine, ReceivesNccl, "weights over NCCL")
        transport = NcclTransport(**kwargs)
    elif plan.transport is Transport.cuda_ipc:
        require(plan.engine, ReceivesIpc, "weights over CUDA IPC")
        transport = CudaIpcTransport(**kwargs, sleep_level=sleep_level, awake=plan.engines_awake,
                                     leads=plan.engine_leads)
    elif plan.transport is Transport.lora_adapter:
        require(plan.engine, PolicyAdapters, "LoRA adapters as the policy")
        transport = AdapterTransport(**kwargs, asleep=plan.colocated and not plan.engines_awake)
    else:
        transport = ObjectStoreTransport(**kwargs, kind=plan.transport, lora=bool(plan.config.learner.lora.enabled),
                                         history=plan.async_steps + 1)
    transport.pauses = has(plan.engine, PausesInFlight)
    return transport


__all__ = ["make_transport"]
