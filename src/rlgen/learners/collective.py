"""The data-parallel ranks of the torch learner: their process group (gloo on CPU, NCCL on GPUs) with
runtime.hang_timeout_s as every collective's timeout, and the one all-reduce a step makes. A collective that fails
(a peer died) or does not finish in time raises CollectiveFailed, which names the rank and the operation."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import timedelta

import torch

from rlgen.learners.group import CollectiveFailed


def join_group(rank: int, world_size: int, master_addr: str, master_port: int, timeout_s: float,
               device: torch.device) -> None:
    """Join the learner group's process group; every collective and the rendezvous wait at most timeout_s. On
    NCCL, blocking wait makes a timed-out collective raise on this rank (torch's default aborts the process)."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{int(master_port)}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=float(timeout_s)))


def sum_over_ranks(tensors: list[torch.Tensor], extra: float, *, rank: int, operation: str,
                   timeout_s: float) -> float:
    """Each tensor summed in place over the group, and extra summed with them, in one all-reduce; returns the
    summed extra. Raises CollectiveFailed when the all-reduce does not complete."""
    import torch.distributed as dist

    flat = torch.cat([t.reshape(-1) for t in tensors] + [torch.tensor([extra], dtype=tensors[0].dtype,
                                                                      device=tensors[0].device)])
    t0 = time.time()
    try:
        dist.all_reduce(flat)
    except Exception as err:  # noqa: BLE001 - gloo and NCCL raise RuntimeError or DistBackendError
        waited = time.time() - t0
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise CollectiveFailed(rank, operation, waited >= 0.9 * timeout_s or "timed out" in first.lower(),
                               first) from None
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return float(flat[-1].item())


def rng_digest(device: torch.device) -> str:
    """A short digest of this process's torch RNG states (and the GPU's): equal digests, equal states."""
    h = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
    if device.type == "cuda":
        h.update(torch.cuda.get_rng_state(device).numpy().tobytes())
    return h.hexdigest()[:16]


def leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["join_group", "leave_group", "rng_digest", "sum_over_ranks"]
