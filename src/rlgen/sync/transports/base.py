"""What every weight transport shares: the result of a push, the interface the loop calls, and the base that
keeps the engines' version, the timeouts and the broken flag (``TransportBase``); ``VLLMTransport`` adds the
learner's weight names and what an update in flight asks of the engines. The transports themselves are
``object_store``, ``vllm_nccl``, ``ipc`` and ``adapter`` beside this module."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rlgen.config import Transport
from rlgen.sync.layout import DEFAULT_BUCKET_BYTES
from rlgen.sync.waits import SLACK_S, Pending, SyncError, SyncReport, SyncTimeoutError, get_all

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from rlgen.sync.sender import WeightMeta


@dataclass
class PushResult:
    """What one push (or a transport's start) did: the version the engines now hold or are taking."""

    version: int
    # per-engine refs of updates still being applied (object store only): the loop parks them as queued
    # updates; each engine applies its update before its next generate()
    pending: list[Pending] = field(default_factory=list)
    results: list[SyncReport] = field(default_factory=list)  # finished: {"actor", "spans", ...}
    seconds: float = 0.0  # driver wall time of push()


class WeightTransport(Protocol):
    """What the run's set-up and loop call on a transport, whichever way it sends the weights."""

    kind: Transport

    def setup(self, learner: ActorHandle, engines: Sequence[ActorHandle], engine_names: Sequence[str], *,
              gatherers: Sequence[ActorHandle] = (), ranks: Sequence[ActorHandle] = ()) -> None: ...
    def start(self) -> PushResult | None: ...
    def sleep_engines(self) -> list[SyncReport]: ...
    def push(self, version: int, *, in_flight: bool = False) -> PushResult: ...
    def wake_engines(self) -> list[SyncReport]: ...
    def replace_engine(self, index: int, actor: ActorHandle, resend: bool = True) -> None: ...
    def generate_at(self, index: int, version: int,
                    generate: Callable[[], ObjectRef]) -> tuple[ObjectRef, list[ObjectRef]]: ...
    def close(self) -> None: ...


class TransportBase:
    """What every transport keeps: the actors it joins, the engines' confirmed version, its timeouts and whether it
    is broken; defaults for the calls a transport has nothing to do in."""

    kind: Transport

    def __init__(self, timeout_s: float, dtype: str = "bfloat16", bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 tp_sizes: Sequence[int] = ()):
        self.timeout_s, self.dtype, self.bucket_bytes = float(timeout_s), dtype, int(bucket_bytes)
        self.tp_sizes = list(tp_sizes)
        self.version = 0  # the last version every engine confirmed; engines start with the learner's weights
        self.slack_s = SLACK_S
        self.broken: str | None = None
        self.held_weights = False  # engines may hold other weights than the learner's (kept warm by another run)
        # engines holding the learner's starting weights may generate before setup() and start() (which then
        # only warms the transport up): runtime.setup lets the first batch go before the learners are ready
        self.generates_before_start = False
        self.pauses = True  # the engines claim PausesInFlight (make_transport reads their spec)
        self.learner: ActorHandle | None = None
        self.gatherers: list[ActorHandle] = []
        self.engines: list[ActorHandle] = []
        self.engine_names: list[str] = []

    def setup(self, learner: ActorHandle, engines: Sequence[ActorHandle], engine_names: Sequence[str], *,
              gatherers: Sequence[ActorHandle] = (), ranks: Sequence[ActorHandle] = ()) -> None:
        """learner: rank 0, which sends. gatherers: the other ranks of a ZeRO-3 group, which must join every
        gather of the full weights (``drain_weights``) while rank 0 exports them. ranks: every learner rank,
        for transports where each sends (colocated IPC)."""
        self.learner, self.engines, self.engine_names = learner, list(engines), list(engine_names)
        self.gatherers = list(gatherers)
        if not self.tp_sizes:
            self.tp_sizes = [1] * len(self.engines)

    def _gather_refs(self, version: int) -> list[ObjectRef]:
        return [g.drain_weights.remote(version, self.dtype, self.bucket_bytes, self.timeout_s) for g in self.gatherers]

    def start(self) -> PushResult | None:
        """Before the first step: the starting weights over this transport, where that warms it up or the
        engines may hold other weights (None: nothing to do)."""
        return None

    def sleep_engines(self) -> list[SyncReport]:
        """The learner is about to train: engines that give their GPU to it go to sleep (colocated, on-policy);
        each sleeping engine's idle span. Engines that stay awake (the rest) are left alone: []."""
        return []

    def wake_engines(self) -> list[SyncReport]:
        """The step was skipped (or the run halts): bring engines back to generating on their old weights."""
        return []

    def close(self) -> None:
        self.learner, self.engines, self.gatherers = None, [], []

    def replace_engine(self, index: int, actor: ActorHandle, resend: bool = True) -> None:
        """Engine ``index`` was re-created (its predecessor died): join the new actor to this transport and, with
        resend, bring it to the current version (without, the next push does: an update that failed because an
        engine died is pushed again to all, the new one included)."""
        raise SyncError(f"{self.kind.value} transport cannot take a re-created engine.")

    def generate_at(self, index: int, version: int,
                    generate: Callable[[], ObjectRef]) -> tuple[ObjectRef, list[ObjectRef]]:
        """generate() on re-created engine ``index`` for a flight launched at ``version``, and the weight updates
        queued after it (refs). Here at the engine's current weights, none queued: engines that take updates while
        they generate mix versions within a flight anyway."""
        return generate(), []

    def _begin(self, version: int, *, resend: bool = False) -> float:
        if self.broken:
            raise SyncError(f"{self.kind.value} weight sync is broken ({self.broken}); restart the run.")
        if int(version) < self.version or (int(version) == self.version and not resend):
            raise SyncError(f"policy version {version} is not newer than the engines' version {self.version}.")
        return time.time()

    def _get(self, refs: Sequence[Pending], what: str, names: Sequence[str] | None = None) -> list[Any]:
        try:
            return get_all(refs, self.timeout_s + self.slack_s, what, names)
        except SyncTimeoutError as err:
            self.broken = str(err)
            raise


class VLLMTransport(TransportBase):
    """A transport through vLLM's native weight transfer (NCCL, CUDA IPC): it reads the learner's weight names."""

    def _meta(self) -> WeightMeta:
        meta = self._get([self.learner.weight_meta.remote(self.dtype)], "reading the learner's weight names")[0]
        self.bucket_bytes = max(self.bucket_bytes, int(meta["max_tensor_bytes"]))
        return meta

    def _pause_kwargs(self, in_flight: bool) -> dict[str, bool]:
        """What an update in flight asks of each engine: pause its running requests (keeping their KV cache)
        for the update, inside its own call, so that they wait for the update only and each engine's sync span
        is its own pause. Engines that cannot pause refuse an update in flight."""
        if not in_flight:
            return {}
        if not self.pauses:
            raise SyncError("these engines cannot pause for a weight update while requests run (PausesInFlight); "
                            "set algo.async_steps=0.")
        return {"pause": True}


__all__ = ["PushResult", "TransportBase", "VLLMTransport", "WeightTransport"]
