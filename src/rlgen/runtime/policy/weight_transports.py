"""Weight transports: the learner's new weights -> every engine, after each applied optimizer step.

One interface (``WeightTransport``), picked by ``plan.transport``: Ray's object store (CPU, hf engines), vLLM's
NCCL weight transfer (engines on GPUs of their own), a resident CUDA IPC buffer (colocated), or LoRA adapters
(``learner.lora.sync=adapter``). ``start()`` sends the starting weights once during set-up, so the first
update's one-off costs stay out of step 0. Every wait has a timeout; a transport whose NCCL or IPC call timed
out marks itself broken and fails every later push at once. The learner's half is
``rlgen.learners.weight_sender``; vllm is imported lazily. docs/weight_sync.md has each transport step by step.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from rlgen.engines.contract import PausesInFlight, PolicyAdapters, ReceivesIpc, ReceivesNccl, has, require
from rlgen.learners.weight_sender import CONTROL_GROUP
from rlgen.plan import Plan, Transport
from rlgen.runtime.policy.ipc_transport import CudaIpcTransport, lead_ranks
from rlgen.runtime.policy.transport_base import PushResult, TransportBase, VLLMTransport, WeightTransport
from rlgen.runtime.rollouts.engine_restarts import engine_died
from rlgen.transfer import DEFAULT_BUCKET_BYTES, NUM_BUFFERS, SyncError, check_versions, get_all
from rlgen.types import Phase

log = logging.getLogger(__name__)
ABORT_GRACE_S = 2.0  # after a failed NCCL update, how long each side may take to leave the broadcast on its own
ABORT_WAIT_S = 30.0  # for the learner's aborted broadcast to return


class ObjectStoreTransport(TransportBase):
    """learner.get_weights() -> Ray object store -> engine.update_weights(ref, version) on every engine. Remote
    engines (kind http) take the same path; each engine's proxy sends the weights on to the server."""

    kind = Transport.ray_object_store

    def __init__(self, *args: Any, kind: Transport = Transport.ray_object_store, lora: bool = False,
                 history: int = 1, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.kind, self.lora = kind, bool(lora)
        self.generates_before_start = kind is not Transport.http and not self.lora
        # the weights of the newest ``history`` versions (algo.async_steps + 1), by version: a flight launched
        # ahead of the learner and lost with its engine is generated again at its own version (generate_at)
        self.history, self.sent = max(1, int(history)), {}

    def setup(self, learner: Any, engines: Sequence[Any], engine_names: Sequence[str], *,
              gatherers: Sequence[Any] = (), ranks: Sequence[Any] = ()) -> None:
        super().setup(learner, engines, engine_names, gatherers=gatherers)
        if self.kind is Transport.ray_object_store and self.history > 1 and not self.gatherers:
            self._keep(self.version, self.learner.get_weights.remote())  # what the engines start with

    def _keep(self, version: int, weights: Any) -> None:
        self.sent[int(version)] = weights
        for old in [v for v in self.sent if v <= int(version) - self.history]:
            del self.sent[old]

    def generate_at(self, index: int, version: int, generate: Callable[[], Any]) -> tuple[Any, list[Any]]:
        """Engines here apply calls in order, and the weights of the last ``history`` versions are kept: the
        re-created engine goes back to ``version``, generates, then takes each later version again, so the
        flight's rollouts are the ones the engine that died would have made."""
        if int(version) >= self.version or int(version) not in self.sent:
            return generate(), []
        engine, name = self.engines[index], self.engine_names[index]
        self._get([engine.update_weights.remote(self.sent[int(version)], int(version))],
                  f"taking the re-created {name} back to version {version} for a flight launched then")
        ref = generate()
        later = sorted(v for v in self.sent if int(version) < v <= self.version)
        return ref, [engine.update_weights.remote(self.sent[v], v) for v in later]

    def start(self) -> PushResult | None:
        # a server's engines may hold another run's weights; LoRA engines hold the base until the merged policy comes
        return self.resend() if self.kind is Transport.http or self.lora or self.held_weights else None

    def resend(self) -> PushResult:
        """Every engine to the learner's current weights at the current version (a server's engines may hold
        another run's)."""
        t0 = time.time()
        weights = self.learner.get_weights.remote()
        gathers = self._gather_refs(self.version)
        refs = [e.update_weights.remote(weights, self.version) for e in self.engines]
        results = self._get(refs + gathers, f"sending the starting weights (version {self.version}) to the engines",
                            [*self.engine_names, *[f"learner{i + 1}" for i in range(len(gathers))]])[: len(refs)]
        check_versions(results, self.version, "the starting weights")
        return PushResult(self.version, results=results, seconds=time.time() - t0)

    def push(self, version: int, *, in_flight: bool = False) -> PushResult:
        t0 = self._begin(version)
        weights = self.learner.get_weights.remote()
        gathers = self._gather_refs(version)
        get_all([weights, *gathers], self.timeout_s, "the learner exporting its weights",
                ["learner0", *[f"learner{i + 1}" for i in range(len(gathers))]], fetch=False)
        t1 = time.time()
        pending = [e.update_weights.remote(weights, version) for e in self.engines]
        self.version = int(version)  # engines apply it in call order, before their next generate()
        if self.kind is Transport.ray_object_store and self.history > 1 and not self.gatherers:
            self._keep(version, weights)
        sync = {"actor": "learner0", "spans": [(Phase.sync.value, t0, t1)]}
        return PushResult(int(version), pending=pending, results=[sync], seconds=time.time() - t0)

    def replace_engine(self, index: int, actor: Any, resend: bool = True) -> None:
        self.engines[index] = actor
        if not resend:
            return
        # the version's own weights where kept: the learner may already hold the next version's (it trains while
        # the driver looks at a flight generated ahead)
        kept = self.sent.get(self.version)
        weights = kept if kept is not None else self.learner.get_weights.remote()
        gathers = self._gather_refs(self.version) if kept is None else []
        name = self.engine_names[index]
        self._get([actor.update_weights.remote(weights, self.version), *gathers],
                  f"bringing the re-created {name} to version {self.version}")


class NcclTransport(VLLMTransport):
    kind = Transport.nccl

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rejoining: set[int] = set()  # engines that left a failed update: the new group waits for them all

    def setup(self, learner: Any, engines: Sequence[Any], engine_names: Sequence[str], *,
              gatherers: Sequence[Any] = (), ranks: Sequence[Any] = ()) -> None:
        super().setup(learner, engines, engine_names, gatherers=gatherers)
        meta = self._meta()
        self.update_info = {k: meta[k] for k in ("names", "dtype_names", "shapes")}
        self.update_info.update(packed=True, packed_buffer_size_bytes=self.bucket_bytes, packed_num_buffers=NUM_BUFFERS)
        addr, port = self._get([self.learner.sync_endpoint.remote()], "picking the NCCL rendezvous port")[0]
        world = 1 + sum(self.tp_sizes)
        offsets = [1 + sum(self.tp_sizes[:i]) for i in range(len(self.engines))]
        refs = [  # ReceivesNccl
            e.init_weight_transfer.remote(
                {"master_address": addr, "master_port": port, "rank_offset": off, "world_size": world}, self.timeout_s
            )
            for e, off in zip(self.engines, offsets)
        ]
        refs.append(self.learner.init_nccl_sender.remote(addr, port, world, self.timeout_s))
        self._get(refs, f"NCCL weight-transfer group of {world} ranks at {addr}:{port}", [*self.engine_names, "learner"])

    def resend(self) -> PushResult:
        """Every engine to the learner's current weights at the current version."""
        return self.push(self.version, resend=True)

    def start(self) -> PushResult:
        return self.resend()  # NCCL's first broadcast sets up its connections: seconds, kept out of step 0

    def replace_engine(self, index: int, actor: Any, resend: bool = True) -> None:
        """A new NCCL group of every engine and the learner (the old one lost a member), then the current
        weights to all; after a failed update, once every engine that left it (rejoining) is re-created."""
        self.engines[index] = actor
        self.rejoining.discard(index)
        if self.rejoining:
            return
        self.broken = None
        self.setup(self.learner, self.engines, self.engine_names, gatherers=self.gatherers)
        if resend:
            self.push(self.version, resend=True)

    def _free_blocked(self, refs: Sequence[Any]) -> None:
        """After an update failed (an engine died inside the broadcast): abort the learner's side of the group,
        which NCCL would otherwise keep waiting in, and stop the engines still inside it (a vLLM worker blocked in
        NCCL cannot be reached), so that the engine keeper re-creates them with the dead one and replace_engine()
        forms a new group. A learner that does not come free leaves the transport broken: the run stops."""
        import ray

        *received, sent = refs[: len(self.engines) + 1]
        if not ray.wait([sent], timeout=ABORT_GRACE_S)[0]:
            t0 = time.time()
            abort = self.learner.abort_weight_group.options(concurrency_group=CONTROL_GROUP).remote()
            with contextlib.suppress(Exception):
                ray.get(abort, timeout=ABORT_WAIT_S)
            if not ray.wait([sent], timeout=ABORT_WAIT_S)[0]:
                log.warning("the learner's NCCL broadcast did not return after its group was aborted")
                return
            log.info("an engine died inside an NCCL update: the learner's broadcast was still waiting for it, so "
                     "its weight-transfer group was aborted (%.1f s); a new group forms", time.time() - t0)
        done, _ = ray.wait(received, num_returns=len(received), timeout=ABORT_GRACE_S)
        for i, (engine, ref) in enumerate(zip(self.engines, received)):
            if ref not in done:
                log.info("%s was still inside the failed NCCL update and cannot leave it: stopped, to be re-created",
                         self.engine_names[i])
                with contextlib.suppress(Exception):
                    ray.kill(engine, no_restart=True)
                self.rejoining.add(i)
            else:
                with contextlib.suppress(Exception):
                    ray.get(ref)
                    continue
                self.rejoining.add(i)
        self.broken = None  # the learner is free: a new group forms once every engine in rejoining is back

    def push(self, version: int, *, in_flight: bool = False, resend: bool = False) -> PushResult:
        t0 = self._begin(version, resend=resend)
        pause = self._pause_kwargs(in_flight)  # in flight: each engine pauses itself around its receive
        refs = [e.receive_weights.remote(self.update_info, version, self.timeout_s, **pause) for e in self.engines]
        refs.append(self.learner.send_weights_nccl.remote(version, self.dtype, self.bucket_bytes, self.timeout_s))
        gathers = self._gather_refs(version)
        names = [*self.engine_names, "learner0", *[f"learner{i + 1}" for i in range(len(gathers))]]
        try:
            results = self._get(refs + gathers, f"NCCL weight update to version {version}", names)[: len(refs)]
        except Exception as err:
            # One side failed while the other may still sit in the broadcast: the group is unusable.
            self.broken = self.broken or f"an NCCL update failed: {err}"
            if engine_died(err):  # otherwise (a hang, the learner's own failure) it stays broken: the run stops
                self._free_blocked(refs)
            raise
        check_versions(results, int(version), "NCCL weight update")
        self.version = int(version)
        return PushResult(int(version), results=results, seconds=time.time() - t0)


class AdapterTransport(TransportBase):
    """LoRA adapters (learner.lora.sync=adapter): engines hold the base model and take each new adapter version
    (megabytes) through Ray's object store; requests started before an update finish on their adapter. asleep:
    colocated engines that sleep while the learner trains (algo.async_steps=0) and wake for the update."""

    kind = Transport.lora_adapter

    def __init__(self, *args: Any, asleep: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.asleep = bool(asleep)

    def setup(self, learner: Any, engines: Sequence[Any], engine_names: Sequence[str], *,
              gatherers: Sequence[Any] = (), ranks: Sequence[Any] = ()) -> None:
        if gatherers:
            raise SyncError("LoRA adapters are sent from learner rank 0 of a ZeRO-2 group; ZeRO-3 is not supported.")
        super().setup(learner, engines, engine_names)

    def start(self) -> PushResult:
        return self._send(self.version, resend=True)  # the starting adapter (new, learner.lora.init's or resumed)

    def before_train(self) -> list[dict[str, Any]]:
        if not self.asleep:
            return []
        t0 = time.time()
        self._get([e.sleep.remote(1) for e in self.engines], "engines going to sleep", self.engine_names)
        return [{"actor": n, "spans": [(Phase.idle.value, t0, time.time())]} for n in self.engine_names]

    def no_update(self) -> list[dict[str, Any]]:
        if self.asleep:
            self._get([e.wake.remote() for e in self.engines], "waking engines", self.engine_names)
        return []

    def push(self, version: int, *, in_flight: bool = False) -> PushResult:
        if self.asleep:
            self._get([e.wake.remote() for e in self.engines], "waking engines", self.engine_names)
        return self._send(version)

    def replace_engine(self, index: int, actor: Any, resend: bool = True) -> None:
        self.engines[index] = actor
        if resend:
            self._send(self.version, resend=True, only=[index])

    def _send(self, version: int, resend: bool = False, only: Sequence[int] | None = None) -> PushResult:
        t0 = self._begin(version, resend=resend)
        picked = list(range(len(self.engines))) if only is None else list(only)
        adapter = self.learner.get_adapter.remote(self.dtype)
        self._get([adapter], f"the learner exporting its adapter (version {version})", ["learner0"])
        t1 = time.time()
        refs = [self.engines[i].load_adapter.remote(adapter, int(version)) for i in picked]  # PolicyAdapters
        results = self._get(refs, f"loading adapter version {version} into the engines",
                            [self.engine_names[i] for i in picked])
        check_versions(results, int(version), "LoRA adapter update")
        self.version = int(version)
        sync = {"actor": "learner0", "spans": [(Phase.sync.value, t0, t1)]}
        return PushResult(int(version), results=[sync, *results], seconds=time.time() - t0)


def make_transport(plan: Plan, cfg: Any, *, bucket_mb: float | None = None, sleep_level: int = 1) -> TransportBase:
    """The transport for plan.transport, once the engine kind claims the capability it calls. cfg is the RunConfig
    (timeout_s, engine.dtype); an update waits at most runtime.hang_timeout_s where that is shorter."""
    bucket = int(bucket_mb * 2**20) if bucket_mb else DEFAULT_BUCKET_BYTES
    kwargs = {"timeout_s": min(cfg.timeout_s, cfg.runtime.hang_timeout_s), "dtype": str(cfg.engine.dtype), "bucket_bytes": bucket,
              "tp_sizes": [e.tensor_parallel_size for e in plan.engines]}
    transport: TransportBase
    if plan.transport is Transport.nccl:
        require(plan.engine, ReceivesNccl, "weights over NCCL")
        transport = NcclTransport(**kwargs)
    elif plan.transport is Transport.cuda_ipc:
        require(plan.engine, ReceivesIpc, "weights over CUDA IPC")
        transport = CudaIpcTransport(**kwargs, sleep_level=sleep_level, awake=plan.engines_awake,
                                     leads=lead_ranks(plan))
    elif plan.transport is Transport.lora_adapter:
        require(plan.engine, PolicyAdapters, "LoRA adapters as the policy")
        transport = AdapterTransport(**kwargs, asleep=plan.colocated and not plan.engines_awake)
    else:
        transport = ObjectStoreTransport(**kwargs, kind=plan.transport, lora=bool(plan.config.learner.lora.enabled),
                                         history=plan.async_steps + 1)
    transport.pauses = has(plan.engine, PausesInFlight)
    return transport


__all__ = ["AdapterTransport", "CudaIpcTransport", "NcclTransport", "ObjectStoreTransport", "PushResult",
           "WeightTransport", "make_transport"]
