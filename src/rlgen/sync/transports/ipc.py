"""Colocated engines take their weights through CUDA IPC: each learner rank packs the weights into a resident
buffer on its own GPU, and the engines on that GPU load them from it in place. With one rank that rank sends to
every engine; with a colocated learner group (hybrid: every GPU both trains and generates) each rank leads the
engines whose first GPU is its own, and an engine spread over several GPUs (tensor parallel) has each worker
read its own GPU's buffer. The learner's half is ``rlgen.sync.sender.WeightSender.send_weights_ipc``, the engine
workers' ``rlgen.sync.receiver.load_ipc_on_worker``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlgen.config import Transport
from rlgen.sync.ipc_buffer import IpcHandle, merged
from rlgen.sync.transports.base import PushResult, VLLMTransport
from rlgen.sync.waits import SyncError, SyncReport, check_versions
from rlgen.types import Phase

if TYPE_CHECKING:
    from ray.actor import ActorHandle


class CudaIpcTransport(VLLMTransport):
    """Colocated engines, weights through CUDA IPC. awake=False (async_steps=0): engines sleep while the learner
    trains and wake for the update. awake=True (async_steps>0): engines stay awake and generate the next batch
    while the learner trains; an update in flight pauses them, keeping their requests' KV cache. leads: each
    engine's learner rank (the plan's ``engine_leads``; every engine on rank 0 when not given)."""

    kind = Transport.cuda_ipc

    def __init__(self, *args: Any, sleep_level: int = 1, awake: bool = False, leads: Sequence[int] = (),
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sleep_level, self.awake = int(sleep_level), bool(awake)
        self.leads = list(leads)
        self.generates_before_start = True  # start() sends the weights the engines hold: it sets the buffer up
        self.ranks: list[ActorHandle] = []
        self.handle: IpcHandle = {}

    def setup(self, learner: ActorHandle, engines: Sequence[ActorHandle], engine_names: Sequence[str], *,
              gatherers: Sequence[ActorHandle] = (), ranks: Sequence[ActorHandle] = ()) -> None:
        """ranks: every learner rank (rank 0 first); each packs its own GPU's buffer, so a ZeRO-3 group's
        gathers need no gatherers here (every rank is in them, sending)."""
        self.ranks = list(ranks) or [learner, *gatherers]
        super().setup(learner, engines, engine_names)
        if not self.leads:
            self.leads = [0] * len(self.engines)
        if len(self.leads) != len(self.engines) or max(self.leads, default=0) >= len(self.ranks):
            raise SyncError(f"the IPC transport has {len(self.engines)} engines led by ranks {self.leads}, but "
                            f"{len(self.ranks)} learner rank(s).")
        self._meta()
        names = [f"learner{r}" for r in range(len(self.ranks))]
        handles = self._get([r.ipc_handle.remote(self.dtype, self.bucket_bytes) for r in self.ranks],
                            "learner ranks sharing their IPC buffers", names)
        self.handle = merged(handles)
        # ReceivesIpc (the learners call receive_ipc)
        self._get([e.init_weight_transfer.remote({}, self.timeout_s) for e in self.engines], "IPC set-up",
                  self.engine_names)

    @property
    def lockstep(self) -> bool:
        """Whether the ranks meet at every chunk: an engine reads the buffers of several GPUs."""
        return len(self.ranks) > 1 and any(tp > 1 for tp in self.tp_sizes)

    def start(self) -> PushResult:
        return self._cycle(self.version, resend=True)  # engines are awake before the first step

    def sleep_engines(self) -> list[SyncReport]:
        if self.awake:
            return []
        t0 = time.time()
        self._get([e.sleep.remote(self.sleep_level) for e in self.engines], "engines going to sleep", self.engine_names)
        return [{"actor": n, "spans": [(Phase.idle.value, t0, time.time())]} for n in self.engine_names]

    def wake_engines(self) -> list[SyncReport]:
        """Level 1 kept the old weights on the CPU: wake everything. Level 2 dropped them: send them again."""
        if self.awake:
            return []
        if self.sleep_level == 1:
            self._get([e.wake.remote() for e in self.engines], "waking engines", self.engine_names)
            return []
        return self._cycle(self.version, resend=True, asleep=True).results

    def push(self, version: int, *, in_flight: bool = False) -> PushResult:
        if in_flight and not self.awake:
            raise SyncError("colocated engines sleep while the learner trains (algo.async_steps=0), so updates "
                            "cannot be in flight.")
        return self._cycle(version, asleep=not self.awake, in_flight=in_flight)

    def replace_engine(self, index: int, actor: ActorHandle, resend: bool = True) -> None:
        """The re-created engine joins IPC and (resend) gets the current weights; the others are untouched."""
        self.engines[index] = actor
        self._get([actor.init_weight_transfer.remote({}, self.timeout_s)], "IPC set-up", [self.engine_names[index]])
        if resend:
            self._cycle(self.version, resend=True, only=[index])

    def _send(self, picked: Sequence[int], version: int, in_flight: bool) -> list[SyncReport]:
        """Every rank packs and sends to the picked engines it leads (a rank that leads none still packs its
        buffer and meets the others); each rank's result, in rank order."""
        refs = []
        for r, rank in enumerate(self.ranks):
            mine = [self.engines[i] for i in picked if self.leads[i] == r]
            refs.append(rank.send_weights_ipc.remote(mine, version, self.dtype, self.bucket_bytes, self.timeout_s,
                                                     in_flight, handle=self.handle, lockstep=self.lockstep))
        return self._get(refs, f"IPC weight update to version {version}",
                         [f"learner{r}" for r in range(len(self.ranks))])

    def _cycle(self, version: int, resend: bool = False, only: Sequence[int] | None = None, *, asleep: bool = False,
               in_flight: bool = False) -> PushResult:
        """One update over IPC: wake the weights of sleeping engines, send, wake their KV cache; or, for awake
        engines with requests in flight, pause them around the send."""
        t0 = self._begin(version, resend=resend)
        picked = list(range(len(self.engines))) if only is None else list(only)
        engines, names = [self.engines[i] for i in picked], [self.engine_names[i] for i in picked]

        if asleep:
            self._get([e.wake.remote(["weights"]) for e in engines], "waking engine weights", names)
        # in flight, the engines pause themselves around the loads (the learners pack the first chunk first)
        try:
            sent = self._send(picked, version, in_flight)
        except Exception:
            if in_flight and not self.broken:  # a learner that failed between chunks left the engines paused
                self._get([e.resume.remote() for e in engines], "resuming engines", names)
            raise
        if asleep:
            self._get([e.wake.remote(["kv_cache"]) for e in engines], "waking engine KV caches", names)
        done = [r for s in sent for r in s.pop("engines", [])]
        check_versions(done, int(version), "IPC weight update")
        if not in_flight:  # asleep or idle: the engines could not generate from the start of the cycle
            done = [{**r, "spans": [(Phase.sync.value, t0, time.time())]} for r in done]
        self.version = int(version)
        return PushResult(int(version), results=[*sent, *done], seconds=time.time() - t0)


__all__ = ["CudaIpcTransport"]
