"""The NCCL transport: engines on GPUs of their own and learner rank 0 form one NCCL group (vLLM's weight-transfer
engine), and each update is one packed broadcast from rank 0 to every engine worker. The first broadcast sets the
connections up, so ``start()`` sends the starting weights once during set-up. An engine that dies inside a
broadcast leaves the others blocked in it: the learner's side of the group is aborted, the engines still inside are
stopped to be re-created, and a new group forms once every one is back (``replace_engine``)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlgen.config import Transport
from rlgen.errors import engine_died
from rlgen.sync.layout import NUM_BUFFERS
from rlgen.sync.sender import CONTROL_GROUP
from rlgen.sync.transports.base import PushResult, VLLMTransport
from rlgen.sync.waits import check_versions

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

log = logging.getLogger(__name__)
ABORT_GRACE_S = 2.0  # after a failed NCCL update, how long each side may take to leave the broadcast on its own
ABORT_WAIT_S = 30.0  # for the learner's aborted broadcast to return


class VllmNcclTransport(VLLMTransport):
    """Engines on GPUs of their own (ReceivesNccl): one packed broadcast from learner rank 0 per update."""

    kind = Transport.nccl

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rejoining: set[int] = set()  # engines that left a failed update: the new group waits for them all

    def setup(self, learner: ActorHandle, engines: Sequence[ActorHandle], engine_names: Sequence[str], *,
              gatherers: Sequence[ActorHandle] = (), ranks: Sequence[ActorHandle] = ()) -> None:
        super().setup(learner, engines, engine_names, gatherers=gatherers)
        meta = self._meta()
        # vLLM's update info: what every engine's receive_weights takes
        self.update_info: dict[str, Any] = {k: meta[k] for k in ("names", "dtype_names", "shapes")}
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

    def replace_engine(self, index: int, actor: ActorHandle, resend: bool = True) -> None:
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

    def _free_blocked(self, refs: Sequence[ObjectRef]) -> None:
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


__all__ = ["VllmNcclTransport"]
