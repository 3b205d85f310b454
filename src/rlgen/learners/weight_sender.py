"""The learner-side half of the GPU weight transports: a mixin that exports, packs and sends a learner's
weights to vLLM engines over NCCL or CUDA IPC (``rlgen.sync`` holds the driver side). vllm is imported lazily.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

from rlgen.sync import (
    DEFAULT_BUCKET_BYTES,
    NUM_BUFFERS,
    SLACK_S,
    SyncError,
    SyncTimeoutError,
    get_all,
    run_with_timeout,
)
from rlgen.types import Phase


class WeightSender:
    """Learner-side half of the GPU transports. The learner class provides ``version``, ``name``, ``device``
    and ``named_weights()``: (name, parameter) in HF checkpoint names. ``iter_weights`` yields full tensors;
    a sharded learner (ZeRO-3) overrides it to gather bucket by bucket."""

    version: int
    name: str
    device: Any
    _nccl_group: Any = None
    sync_blocked: str | None = None  # set when the learner's weights must not be exported

    def named_weights(self) -> list[tuple[str, Any]]:
        return list(self.model.named_parameters())

    @staticmethod
    def full_shape(param: Any) -> tuple[int, ...]:
        return tuple(getattr(param, "ds_shape", None) or param.shape)  # ZeRO-3 keeps the full shape aside

    def weight_meta(self, dtype: str) -> dict[str, Any]:
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

    def iter_weights(self, dtype: str | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[tuple[str, Any]]:
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

    def init_nccl_sender(self, master_address: str, master_port: int, world_size: int, timeout_s: float) -> dict:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        t0 = time.time()
        info = {"master_address": master_address, "master_port": master_port, "world_size": world_size}
        self._nccl_group = run_with_timeout(
            lambda: NCCLWeightTransferEngine.trainer_init(info), timeout_s, f"{self.name}: NCCL group set-up"
        )
        return {"actor": self.name, "spans": [(Phase.sync.value, t0, time.time())]}

    def send_weights_nccl(self, version: int, dtype: str, bucket_bytes: int, timeout_s: float) -> dict:
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
        try:
            run_with_timeout(send, timeout_s, f"{self.name}: NCCL broadcast of version {version}")
        except SyncTimeoutError:
            self.sync_blocked = "an NCCL broadcast timed out and may still be blocked"
            raise
        return {"actor": self.name, "version": int(version), "spans": [(Phase.sync.value, t0, time.time())]}

    def send_weights_ipc(self, engines: list[Any], version: int, dtype: str, bucket_bytes: int, timeout_s: float) -> dict:
        """Drive a whole IPC update of every (awake-weights) engine on this GPU: start, one packed chunk at a
        time through CUDA IPC handles, finish. Returns the engines' finish results under "engines"."""
        from dataclasses import asdict

        import torch
        from vllm.distributed.weight_transfer.ipc_engine import (
            IPCTrainerSendWeightsArgs,
            IPCWeightTransferEngine,
        )

        self._check_send(version)
        t0 = time.time()
        get_all([e.start_weight_update.remote(timeout_s) for e in engines], timeout_s + SLACK_S, "start_weight_update")
        t1 = time.time()
        chunks, loading = [0], [0.0]

        def deliver(update_info: Any) -> None:  # the engines have read the buffer once this returns
            info = asdict(update_info)
            c0 = time.time()
            get_all([e.load_weight_chunk.remote(info, timeout_s) for e in engines], timeout_s + SLACK_S, "IPC chunk")
            loading[0] += time.time() - c0
            chunks[0] += 1

        args = IPCTrainerSendWeightsArgs(send_mode=deliver, packed=True, packed_buffer_size_bytes=bucket_bytes)
        IPCWeightTransferEngine.trainer_send_weights(self.iter_weights(dtype, bucket_bytes), args)
        torch.cuda.synchronize()
        t2 = time.time()
        done = get_all(
            [e.finish_weight_update.remote(version, timeout_s) for e in engines], timeout_s + SLACK_S, "finish_weight_update"
        )
        t3 = time.time()
        # where an update's time goes: the engines' start and finish calls, their loading of the chunks, and the
        # packing into the IPC buffer on this side (the rest of the send)
        parts = {"start": t1 - t0, "load": loading[0], "pack": t2 - t1 - loading[0], "finish": t3 - t2}
        return {"actor": self.name, "version": int(version), "chunks": chunks[0], "engines": done, "parts": parts,
                "spans": [(Phase.sync.value, t0, t3)]}


