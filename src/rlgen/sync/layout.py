"""How the weights are cut for the wire: the packed buffer's size (``DEFAULT_BUCKET_BYTES``, raised to the largest
tensor), how many such buffers NCCL alternates between, and ``plan_buckets``, which splits the tensors in order into
runs that fit one buffer (a ZeRO-3 learner gathers its parameters one such bucket at a time). The CUDA IPC buffer's
own layout, aligned for every dtype, is ``rlgen.sync.ipc_buffer.ipc_layout``."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_BUCKET_BYTES = 1 << 30  # packed-buffer size; raised to the largest tensor when that is larger
NUM_BUFFERS = 2  # NCCL double buffering: pack chunk k+1 while chunk k is on the wire


def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> list[range]:
    """Split tensors (by byte size, in order) into consecutive ranges of at most bucket_bytes each; a tensor
    larger than bucket_bytes forms a bucket of its own. Every index appears exactly once, in order."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be positive")
    buckets: list[range] = []
    start, used = 0, 0
    for i, size in enumerate(sizes):
        if i > start and used + size > bucket_bytes:
            buckets.append(range(start, i))
            start, used = i, 0
        used += size
    if start < len(sizes):
        buckets.append(range(start, len(sizes)))
    return buckets


__all__ = ["DEFAULT_BUCKET_BYTES", "NUM_BUFFERS", "plan_buckets"]
