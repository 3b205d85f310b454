"""The resident CUDA IPC buffer that carries a colocated learner's weights into its vLLM engines.

The learner allocates one buffer for the run and shares it once; each engine worker opens it once, keeps it
open, and loads each chunk of the layout (at most ``bucket_bytes``, aligned for every dtype) in place: no
allocation, no handle opened again, no copy on the engine's side. docs/weight_sync.md ("CUDA IPC") has the
whole update. ``load_ipc_on_worker`` runs inside each vLLM worker through ``collective_rpc`` and is pickled by
reference, so it stays a module-level function. torch is imported inside the functions: importing this module
is free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ALIGN_BYTES = 256  # every tensor starts on this boundary inside the buffer


def _align(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


def ipc_layout(names: Sequence[str], shapes: Sequence[Sequence[int]], dtype_names: Sequence[str],
               sizes: Sequence[int], bucket_bytes: int) -> list[dict[str, Any]]:
    """Chunks of the buffer, in order: names, dtype_names, shapes, byte offsets and the bytes the chunk spans.
    A tensor larger than bucket_bytes forms a chunk of its own (the buffer grows to hold it)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be positive")
    chunks: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
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


def buffer_bytes(layout: Sequence[dict[str, Any]]) -> int:
    """The buffer that holds the largest chunk."""
    return max((c["nbytes"] for c in layout), default=0)


def chunk_views(buffer: torch.Tensor, chunk: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views of one chunk inside a flat uint8 buffer."""

    import torch

    out = []
    for name, dtype, shape, off in zip(chunk["names"], chunk["dtype_names"], chunk["shapes"], chunk["offsets"]):
        dt = getattr(torch, dtype)
        n = math.prod(shape) * dt.itemsize
        out.append((name, buffer[off:off + n].view(dt).view(shape)))
    return out


def share(buffer: torch.Tensor) -> dict[str, Any]:
    """A CUDA buffer's IPC handle, keyed by its GPU's UUID: the arguments torch's rebuild_cuda_tensor takes."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(buffer)
    return {"gpu": str(torch.cuda.get_device_properties(buffer.device).uuid), "args": tuple(args)}


def merged(handles: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One handle for the buffers of several learner ranks, one per GPU: an engine spread over several GPUs
    (tensor parallel) has each of its workers open the buffer on its own GPU."""
    return {"parts": [p for h in handles for p in h.get("parts", [h])]}


def part_for(handle: dict[str, Any], gpu: str) -> dict[str, Any]:
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


def _open(worker: Any, handle: dict[str, Any], device: torch.device) -> torch.Tensor:
    """This GPU's shared buffer, opened on the first call and kept on the worker (a new handle replaces it)."""
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    part = part_for(handle, str(torch.cuda.get_device_properties(device).uuid))
    key = (part["args"][7], part["args"][9])  # the memory handle and the storage's offset in it
    cached = getattr(worker, "_rlgen_ipc_buffer", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    args = list(part["args"])
    args[6] = device.index  # the sender's device index may differ from this process's numbering
    buffer = rebuild_cuda_tensor(*args)
    worker._rlgen_ipc_buffer = (key, buffer)
    return buffer


def load_ipc_on_worker(worker: Any, handle: dict[str, Any], chunk: dict[str, Any], clone: bool = False) -> int:
    """Inside a vLLM worker: load one chunk of the shared buffer into the live model. The model's own
    load_weights maps Hugging Face names onto vLLM's fused layers and copies into the parameters' storage
    (captured CUDA graphs stay valid). clone=True copies the views first, for a loader that keeps them past
    this call (vLLM's layerwise reload, after sleep level 2) while the learner reuses the buffer."""
    import torch

    model = worker.get_model()
    # the worker's GPU: during vLLM's layerwise reload the parameters sit on the meta device
    device = getattr(worker, "device", None) or torch.device("cuda", torch.cuda.current_device())
    views = chunk_views(_open(worker, handle, device), chunk)
    if clone:
        views = [(name, t.clone()) for name, t in views]
    with torch.no_grad(), torch.device(device):  # a reload materialises its layers on the current device
        model.load_weights(views)
    torch.cuda.synchronize(device)
    return len(views)


__all__ = ["ALIGN_BYTES", "buffer_bytes", "chunk_views", "ipc_layout", "load_ipc_on_worker", "merged", "part_for",
           "share"]
