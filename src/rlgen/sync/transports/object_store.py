"""The object-store transport: the learner's weights go through Ray's object store to every engine, which loads
them through its own ``update_weights`` (CPU, hf engines, and a server's engines, kind http). The driver does not
wait for the engines' loads: each engine applies the update before its next generate() (``PushResult.pending``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rlgen.config import Transport
from rlgen.sync.transports.base import PushResult, TransportBase
from rlgen.sync.waits import check_versions, get_all
from rlgen.types import Phase

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle


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
        self.history = max(1, int(history))
        self.sent: dict[int, ObjectRef] = {}

    def setup(self, learner: ActorHandle, engines: Sequence[ActorHandle], engine_names: Sequence[str], *,
              gatherers: Sequence[ActorHandle] = (), ranks: Sequence[ActorHandle] = ()) -> None:
        super().setup(learner, engines, engine_names, gatherers=gatherers)
        if self.kind is Transport.ray_object_store and self.history > 1 and not self.gatherers:
            self._keep(self.version, self.learner.get_weights.remote())  # what the engines start with

    def _keep(self, version: int, weights: ObjectRef) -> None:
        self.sent[int(version)] = weights
        for old in [v for v in self.sent if v <= int(version) - self.history]:
            del self.sent[old]

    def generate_at(self, index: int, version: int,
                    generate: Callable[[], ObjectRef]) -> tuple[ObjectRef, list[ObjectRef]]:
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

    def replace_engine(self, index: int, actor: ActorHandle, resend: bool = True) -> None:
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


__all__ = ["ObjectStoreTransport"]
