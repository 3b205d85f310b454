"""The run's weight transport, from its plan: a table of the paths (``TRANSPORTS``, one ``TransportSpec`` per
``plan.transport``) saying which engine capability each path calls (``rlgen.engines.contract``) and how it is
built from the plan (the engines' seats and sleep the plan decided). ``make_transport`` looks the plan's path up,
checks the engine kind claims the capability, and builds it. A new path is a ``Transport`` name the plan can
pick and one ``register_transport`` call; a spec registered for a name replaces its path. The
transports themselves, and everything else of weight sync, are ``rlgen.sync``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlgen.config import RunConfig, Transport
from rlgen.engines.contract import PausesInFlight, PolicyAdapters, ReceivesIpc, ReceivesNccl, has, require
from rlgen.plan import Plan
from rlgen.sync.layout import DEFAULT_BUCKET_BYTES
from rlgen.sync.transports import (
    AdapterTransport,
    CudaIpcTransport,
    ObjectStoreTransport,
    TransportBase,
    VllmNcclTransport,
)


@dataclass(frozen=True)
class TransportSpec:
    """One weight path: the plan's name for it, the engine capability it calls (None: every engine kind takes it)
    with the work in words for the refusal, and how it is built from the plan and the shared settings (timeout,
    dtype, bucket, TP sizes: ``shared``) and the sleep level."""

    kind: Transport
    needs: type | None
    what: str
    build: Callable[[Plan, dict[str, Any], int], TransportBase]


TRANSPORTS: dict[Transport, TransportSpec] = {}


def register_transport(spec: TransportSpec) -> TransportSpec:
    """Add a path to the table (one kind, one spec: a second spec of a kind replaces the first)."""
    TRANSPORTS[spec.kind] = spec
    return spec


def transport_spec(kind: Transport) -> TransportSpec:
    try:
        return TRANSPORTS[Transport(kind)]
    except (KeyError, ValueError):
        known = ", ".join(sorted(k.value for k in TRANSPORTS))
        raise LookupError(f"no weight transport is registered for {kind!r}; registered: {known}.") from None


def _object_store(plan: Plan, shared: dict[str, Any], sleep_level: int) -> TransportBase:
    return ObjectStoreTransport(**shared, kind=plan.transport, lora=bool(plan.config.learner.lora.enabled),
                                history=plan.async_steps + 1)


def _ipc(plan: Plan, shared: dict[str, Any], sleep_level: int) -> TransportBase:
    return CudaIpcTransport(**shared, sleep_level=sleep_level, awake=plan.engines_awake, leads=plan.engine_leads)


def _adapters(plan: Plan, shared: dict[str, Any], sleep_level: int) -> TransportBase:
    return AdapterTransport(**shared, asleep=plan.colocated and not plan.engines_awake)


for _spec in (
    TransportSpec(Transport.ray_object_store, None, "weights through Ray's object store", _object_store),
    TransportSpec(Transport.http, None, "weights to a server's engines over HTTP", _object_store),
    TransportSpec(Transport.nccl, ReceivesNccl, "weights over NCCL in vLLM's packed format",
                  lambda plan, shared, level: VllmNcclTransport(**shared)),
    TransportSpec(Transport.cuda_ipc, ReceivesIpc, "weights over CUDA IPC", _ipc),
    TransportSpec(Transport.lora_adapter, PolicyAdapters, "LoRA adapters as the policy", _adapters),
):
    register_transport(_spec)


def make_transport(plan: Plan, cfg: RunConfig, *, bucket_mb: float | None = None,
                   sleep_level: int = 1) -> TransportBase:
    """The transport for plan.transport, once the engine kind claims the capability it calls. cfg is the RunConfig
    (timeout_s); the weights go in the engines' dtype as the plan resolved it (plan.config.engine.dtype, from
    precision where engine.dtype is null); an update waits at most runtime.hang_timeout_s where that is shorter."""
    spec = transport_spec(plan.transport)
    if spec.needs is not None:
        require(plan.engine, spec.needs, spec.what)
    bucket = int(bucket_mb * 2**20) if bucket_mb else DEFAULT_BUCKET_BYTES
    shared = {"timeout_s": min(cfg.timeout_s, cfg.runtime.hang_timeout_s), "dtype": str(plan.config.engine.dtype),
              "bucket_bytes": bucket, "tp_sizes": [e.tensor_parallel_size for e in plan.engines]}
    transport = spec.build(plan, shared, sleep_level)
    transport.pauses = has(plan.engine, PausesInFlight)
    return transport


__all__ = ["TRANSPORTS", "TransportSpec", "make_transport", "register_transport", "transport_spec"]
