"""The LoRA adapter transport (``learner.lora.sync=adapter``): engines keep the base model, and each policy version
is a new adapter (megabytes) that learner rank 0 exports and every engine loads through Ray's object store.
Colocated engines that sleep while the learner trains wake for the update."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlgen.config import Transport
from rlgen.sync.transports.base import PushResult, TransportBase
from rlgen.sync.waits import SyncError, SyncReport, check_versions
from rlgen.types import Phase

if TYPE_CHECKING:
    from ray.actor import ActorHandle


class AdapterTransport(TransportBase):
    """LoRA adapters (learner.lora.sync=adapter): engines hold the base model and take each new adapter version
    (megabytes) through Ray's object store; requests started before an update finish on their adapter. asleep:
    colocated engines that sleep while the learner trains (algo.async_steps=0) and wake for the update."""

    kind = Transport.lora_adapter

    def __init__(self, *args: Any, asleep: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.asleep = bool(asleep)

    def setup(self, learner: ActorHandle, engines: Sequence[ActorHandle], engine_names: Sequence[str], *,
              gatherers: Sequence[ActorHandle] = (), ranks: Sequence[ActorHandle] = ()) -> None:
        if gatherers:
            raise SyncError("LoRA adapters are sent from learner rank 0 of a ZeRO-2 group; ZeRO-3 is not supported.")
        super().setup(learner, engines, engine_names)

    def start(self) -> PushResult:
        return self._send(self.version, resend=True)  # the starting adapter (new, learner.lora.init's or resumed)

    def sleep_engines(self) -> list[SyncReport]:
        if not self.asleep:
            return []
        t0 = time.time()
        self._get([e.sleep.remote(1) for e in self.engines], "engines going to sleep", self.engine_names)
        return [{"actor": n, "spans": [(Phase.idle.value, t0, time.time())]} for n in self.engine_names]

    def wake_engines(self) -> list[SyncReport]:
        if self.asleep:
            self._get([e.wake.remote() for e in self.engines], "waking engines", self.engine_names)
        return []

    def push(self, version: int, *, in_flight: bool = False) -> PushResult:
        if self.asleep:
            self._get([e.wake.remote() for e in self.engines], "waking engines", self.engine_names)
        return self._send(version)

    def replace_engine(self, index: int, actor: ActorHandle, resend: bool = True) -> None:
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


__all__ = ["AdapterTransport"]
