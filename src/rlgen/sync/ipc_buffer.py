"""The resident CUDA IPC buffer that carries a colocated learner's weights into its vLLM engines.

The learner allocates one buffer for the run and shares it once; each engine worker opens it once, keeps it
open, and loads each chunk of the layout (at most ``bucket_bytes``, aligned for every dtype) in place: no
allocation, no handle opened again, no copy on the engine's side. This module holds the buffer's layout, its
views and its handles (the learner's sender makes and shares it, the driver merges every rank's handle); the
worker's side, which opens it and loads a chunk, is ``rlgen.sync.receiver.load_ipc_on_worker``.
docs/weight_sync.md ("CUDA IPC") has the whole update. torch is imported inside the functions: importing this
module is free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

if TYPE_CHECKING:
    import torch

# a shared buffer as other processes open it: {"gpu": UUID, "args": torch's rebuild arguments}, or several
# ranks' merged as {"parts": [...]}
IpcHandle: TypeAlias = "dict[str, Any]"


class Chunk(TypedDict):
    """One chunk of the buffer's layout: its tensors (name, dtype, shape, byte offset) and the bytes it spans."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    offsets: list[int]
    nbytes: int

ALIGN_BYTES = 256  # every tensor starts on this boundary inside the buffer


def _align(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


def ipc_layout(names: Sequence[str], shapes: Sequence[Sequence[int]], dtype_names: Sequence[str],
               sizes: Sequence[int], bucket_bytes: int) -> list[Chunk]:
    """Chunks of the buffer, in order: names, dtype_names, shapes, byte offsets and the bytes the chunk spans.
    A tensor larger than bucket_bytes forms a chunk of its own (the buffer grows to hold it)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be positive")
    chunks: list[Chunk] = []
    cur: Chunk | None = None
    for name, shape, dtype, size in zip(names, shapes, dtype_names, sizes, strict=True):
        start = _align(cur["nbytes"]) if cur else 0
        if cur is None or (cur["names"] and start + size > bucket_bytes):
            cur = {"names": [], "dtype_names": [], "shapes": [], "offsets": [], "nbytes": 0}
            chunks.append(cur)
            start = 0
        cur["names"].append(name)
        cur["dtype_names"].append(dtype)
        cur["shapes"].append(list(shape))
        cur["offsets"].append(start)
        cur["nbytes"] = start + int(size)
    return chunks


def buffer_bytes(layout: Sequence[Chunk]) -> int:
    """The buffer that holds the largest chunk."""
    return max((c["nbytes"] for c in layout), default=0)


def chunk_views(buffer: torch.Tensor, chunk: Chunk) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views of one chunk inside a flat uint8 buffer."""

    import torch

    out = []
    for name, dtype, shape, off in zip(chunk["names"], chunk["dtype_names"], chunk["shapes"], chunk["offsets"]):
        dt = getattr(torch, dtype)
        n = math.prod(shape) * dt.itemsize
        out.append((name, buffer[off:off + n].view(dt).view(shape)))
    return out


def share(buffer: torch.Tensor) -> IpcHandle:
    """A CUDA buffer's IPC handle, keyed by its GPU's UUID: the arguments torch's rebuild_cuda_tensor takes."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(buffer)
    return {"gpu": str(torch.cuda.get_device_properties(buffer.device).uuid), "args": tuple(args)}


def merged(handles: Sequence[IpcHandle]) -> IpcHandle:
    """One handle for the buffers of several learner ranks, one per GPU: an engine spread over several GPUs
    (tensor parallel) has each of its workers open the buffer on its own GPU."""
    return {"parts": [p for h in handles for p in h.get("parts", [h])]}


def part_for(handle: IpcHandle, gpu: str) -> IpcHandle:
    """The part of ``handle`` whose buffer lives on the GPU with UUID ``gpu``."""
    parts = handle.get("parts", [handle])
    for part in parts:
        if part.get("gpu") == gpu:
            return part
    have = ", ".join(str(p.get("gpu")) for p in parts)
    raise RuntimeError(
        f"no learner's IPC buffer lives on GPU {gpu} (the buffers are on {have}); CUDA IPC weight updates need a "
        "learner rank on every GPU of a colocated engine (hardware.colocated)."
    )


__all__ = ["ALIGN_BYTES", "Chunk", "IpcHandle", "buffer_bytes", "chunk_views", "ipc_layout", "merged", "part_for", "share"]
