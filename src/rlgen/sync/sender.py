"""The learner's end of the GPU weight paths: ``WeightSender``, a mixin of the learner actor that exports its
weights, packs them and sends them to the vLLM engines over NCCL (one packed broadcast from rank 0) or CUDA IPC
(every rank packs its GPU's resident buffer, then has the engines it leads load each chunk). The driver's side is
``rlgen.sync.transports``; the engine workers' side is ``rlgen.sync.receiver``. vllm is imported lazily.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

from rlgen.sync.ipc_buffer import Chunk, IpcHandle, buffer_bytes, chunk_views, ipc_layout, share
from rlgen.sync.layout import DEFAULT_BUCKET_BYTES, NUM_BUFFERS
from rlgen.sync.waits import SLACK_S, SyncError, SyncReport, SyncTimeoutError, get_all, run_with_timeout
from rlgen.types import Phase

if TYPE_CHECKING:
    import torch
    from ray.actor import ActorHandle

CONTROL_GROUP = "control"  # the learner's concurrency group for calls that must not wait behind a blocked one
# the weights as packed into the IPC buffer: each chunk's (name, view of the buffer) pairs
ChunkViews: TypeAlias = "list[list[tuple[str, torch.Tensor]]]"


class WeightMeta(TypedDict):
    """What the engines need to receive an update (names, dtype_names, shapes: vLLM's update info) and its size."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    max_tensor_bytes: int
    total_bytes: int


class WeightSender:
    """Learner-side half of the GPU transports. The learner class provides ``version``, ``name``, ``device``
    and ``model``. ``named_weights()`` is (name, parameter) in HF checkpoint names and ``iter_weights`` yields
    the full tensors to send: here the model's own parameters; a learner whose policy is not its model's
    parameters as they are (LoRA adapters merged in: ``rlgen.learners.sending``; ZeRO-3 gathers, bucket by
    bucket) overrides both."""

    version: int
    name: str
    device: torch.device | str
    model: torch.nn.Module
    _nccl_group: Any = None  # vLLM's trainer-side NCCL communicator (vllm is imported lazily)
    sync_blocked: str | None = None  # set when the learner's weights must not be exported

    def named_weights(self) -> list[tuple[str, torch.nn.Parameter]]:
        """(name, parameter) of the policy, in HF checkpoint names and in the order they are sent."""
        return list(self.model.named_parameters())

    @staticmethod
    def full_shape(param: torch.Tensor) -> tuple[int, ...]:
        return tuple(getattr(param, "ds_shape", None) or param.shape)  # ZeRO-3 keeps the full shape aside

    def weight_meta(self, dtype: str) -> WeightMeta:
        """names, dtype_names, shapes (the update info vLLM needs) and the largest tensor's bytes."""
        import torch

        item = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        named = self.named_weights()
        shapes = [list(self.full_shape(p)) for _, p in named]
        return {
            "names": [n for n, _ in named],
            "dtype_names": [dtype] * len(named),
            "shapes": shapes,
            "max_tensor_bytes": max((math.prod(s) * item for s in shapes), default=0),
            "total_bytes": sum(math.prod(s) * item for s in shapes),
        }

    def iter_weights(self, dtype: str | None = None,
                     bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor [full shape]) in named_weights() order, cast to dtype (a view when it already is)."""
        import torch

        target = getattr(torch, dtype) if dtype else None
        for name, p in self.named_weights():
            t = p.detach()
            yield name, (t.to(target) if target is not None else t)

    def _check_send(self, version: int) -> None:
        if self.sync_blocked:
            raise SyncError(f"{self.name}: weights cannot be exported: {self.sync_blocked}")
        if int(version) != self.version:
            raise SyncError(
                f"{self.name}: asked to send policy version {version}, but the learner is at version "
                f"{self.version}; the driver and learner disagree about which update happened."
            )

    def sync_endpoint(self) -> tuple[str, int]:
        """This host's address and a free port, for the NCCL group's rendezvous (the learner is rank 0)."""
        from vllm.utils.network_utils import get_ip, get_open_port

        return get_ip(), get_open_port()

    def init_nccl_sender(self, master_address: str, master_port: int, world_size: int,
                         timeout_s: float) -> SyncReport:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        t0 = time.time()
        info = {"master_address": master_address, "master_port": master_port, "world_size": world_size}
        self._nccl_group = run_with_timeout(
            lambda: NCCLWeightTransferEngine.trainer_init(info), timeout_s, f"{self.name}: NCCL group set-up"
        )
        return {"actor": self.name, "spans": [(Phase.sync.value, t0, time.time())]}

    def abort_weight_group(self) -> bool:
        """Abort the NCCL weight-transfer group (ncclCommAbort): a broadcast blocked on an engine that died mid-update
        returns, and the next init_nccl_sender() forms a new group. Called in the learner's "control" concurrency
        group, beside the blocked send_weights_nccl(). True when there was a group to abort."""
        group, self._nccl_group = self._nccl_group, None
        if group is None:
            return False
        group.destroy()  # vLLM's PyNcclCommunicator: ncclCommAbort on a thread, waited for a few seconds
        return True

    def send_weights_nccl(self, version: int, dtype: str, bucket_bytes: int, timeout_s: float) -> SyncReport:
        """Broadcast every weight, packed, to the engines (which must be in receive_weights concurrently)."""
        import torch
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerSendWeightsArgs,
            NCCLWeightTransferEngine,
        )

        self._check_send(version)
        if self._nccl_group is None:
            raise SyncError(f"{self.name}: send_weights_nccl() before init_nccl_sender().")
        args = NCCLTrainerSendWeightsArgs(
            group=self._nccl_group, packed=True, packed_buffer_size_bytes=bucket_bytes, packed_num_buffers=NUM_BUFFERS
        )

        def send() -> None:
            torch.cuda.set_device(self.device)
            NCCLWeightTransferEngine.trainer_send_weights(self.iter_weights(dtype, bucket_bytes), args)
            torch.cuda.synchronize()

        t0 = time.time()
        group = self._nccl_group
        try:
            run_with_timeout(send, timeout_s, f"{self.name}: NCCL broadcast of version {version}")
        except SyncTimeoutError:
            self.sync_blocked = "an NCCL broadcast timed out and may still be blocked"
            raise
        if self._nccl_group is not group:  # aborted while it ran: the engines did not all receive this version
            raise SyncError(f"{self.name}: the NCCL broadcast of version {version} was aborted (an engine died "
                            "during the update); a new weight-transfer group is formed.")
        t1 = time.time()
        return {"actor": self.name, "version": int(version), "spans": [(Phase.sync.value, t0, t1)],
                "parts": {"send": t1 - t0}}

    def _ipc_buffer(self, dtype: str, bucket_bytes: int) -> tuple[IpcHandle, list[Chunk], ChunkViews]:
        """The resident IPC buffer's shared handle, its layout and each chunk's (name, view) pairs: made on the
        first update, then reused (the layout follows the weights' names, shapes and dtype, which do not change
        during a run)."""
        import torch

        key = (dtype, int(bucket_bytes))
        made = getattr(self, "_ipc", None)
        if made is None or made[0] != key:
            self._ipc = None  # a new layout: the old buffer goes first
            meta = self.weight_meta(dtype)
            sizes = [math.prod(s) * getattr(torch, dtype).itemsize for s in meta["shapes"]]
            layout = ipc_layout(meta["names"], meta["shapes"], meta["dtype_names"], sizes, bucket_bytes)
            buffer = torch.empty(buffer_bytes(layout), dtype=torch.uint8, device=self.device)
            self._ipc = (key, self._share_ipc(buffer), layout, [chunk_views(buffer, c) for c in layout])
        return self._ipc[1], self._ipc[2], self._ipc[3]

    def _share_ipc(self, buffer: torch.Tensor) -> IpcHandle:
        return share(buffer)

    def ipc_handle(self, dtype: str, bucket_bytes: int) -> IpcHandle:
        """This rank's resident IPC buffer (made now if it is not yet) as a handle other processes open: the
        driver merges every rank's into one, so an engine spread over several GPUs finds a buffer on each."""
        return self._ipc_buffer(dtype, bucket_bytes)[0]

    def _ranks_barrier(self) -> None:
        """Wait for every rank of the learner group (a one-element all-reduce, waited for on this side)."""
        import torch
        import torch.distributed as dist

        if getattr(self, "world_size", 1) > 1 and dist.is_available() and dist.is_initialized():
            t = torch.zeros(1, device=self.device)
            dist.all_reduce(t)
            t.item()

    def send_weights_ipc(self, engines: list[ActorHandle], version: int, dtype: str, bucket_bytes: int,
                         timeout_s: float, pause: bool = False, handle: IpcHandle | None = None,
                         lockstep: bool = False) -> SyncReport:
        """A whole IPC update of the engines this rank leads: pack each chunk of the layout into the resident
        buffer, then have the engines load it. With pause=True (an update in flight) the engines pause their
        requests (keeping the KV cache) on the first chunk and resume after the last, so the pause covers the
        loads only: the first chunk is packed while they still generate. Returns the engines' last results
        under "engines".

        Colocated learner groups: every rank packs its own GPU's buffer (``handle``: every rank's, merged), and
        leads the engines whose first GPU is its own. With lockstep (an engine spans several GPUs) the ranks
        meet twice a chunk: after packing it, so an engine's workers find it in every GPU's buffer, and after
        the loads, so no rank packs the next chunk over one still being read. A rank may lead no engine."""

        self._check_send(version)
        t0 = time.time()
        own, layout, views = self._ipc_buffer(dtype, bucket_bytes)
        handle = handle or own
        names = [n for n, _ in self.named_weights()]
        if names != [n for c in layout for n in c["names"]]:  # checked before any engine loads a chunk
            raise SyncError(f"{self.name}: the learner's {len(names)} parameters no longer match the IPC buffer's "
                            "layout, made on the first update; the learner's parameters changed during the run.")
        t1 = time.time()
        weights = self.iter_weights(dtype, bucket_bytes)
        packing = loading = waiting = 0.0
        done: list[SyncReport] = []
        for k, (chunk, chunk_view) in enumerate(zip(layout, views)):
            p0 = time.time()
            self._pack(weights, chunk_view)
            p1 = time.time()
            if lockstep:
                self._ranks_barrier()
            p2 = time.time()
            if engines:
                done = get_all([e.receive_ipc.remote(handle, chunk, version, first=k == 0, last=k == len(layout) - 1,
                                                     pause=pause, timeout_s=timeout_s) for e in engines],
                               timeout_s + SLACK_S, f"IPC chunk {k + 1} of {len(layout)}")
            p3 = time.time()
            if lockstep:
                self._ranks_barrier()
            packing, loading, waiting = packing + p1 - p0, loading + p3 - p2, waiting + p2 - p1 + time.time() - p3
        # where an update's time goes: making the buffer (first update only), packing it on this side, the
        # engines' loads (with their pause, when in flight), and waiting for the other ranks
        parts = {"start": t1 - t0, "pack": packing, "load": loading}
        if lockstep:
            parts["ranks"] = waiting
        return {"actor": self.name, "version": int(version), "chunks": len(layout), "engines": done, "parts": parts,
                "spans": [(Phase.sync.value, t0, time.time())]}

    def _pack(self, weights: Iterator[tuple[str, torch.Tensor]], chunk_view: list[tuple[str, torch.Tensor]]) -> None:
        """The next weights from ``weights`` into one chunk's views of the buffer, in the layout's order."""
        import torch

        with torch.no_grad():
            for name, view in chunk_view:
                got = next(weights, None)
                if got is None or got[0] != name:
                    raise SyncError(f"{self.name}: the weights no longer match the IPC layout at {name!r} (got "
                                    f"{got[0] if got else 'nothing'!r}); the learner's parameters changed.")
                view.copy_(got[1])
        if torch.device(self.device).type == "cuda":  # the buffer lives on the learner's device
            torch.cuda.synchronize(self.device)  # the engines read the buffer from other processes
