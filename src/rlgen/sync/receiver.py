"""The engine's end of every weight path: what runs inside each vLLM worker process, sent there by the engine actor
through ``collective_rpc`` (``rlgen.engines.vllm.updates``), and the wire format of the object-store path.

- object store: the engine actor cuts the weights into chunks (``chunk_weights``) of raw bytes (``to_wire``: vLLM's
  RPC decoder passes bytes through untouched); each worker rebuilds and loads them (``load_weights_on_worker``).
- NCCL: each worker takes the learner's packed broadcast straight into the model (``receive_nccl_on_worker``).
- CUDA IPC: each worker opens the learner's resident buffer on its GPU once and loads one chunk of it per call
  (``load_ipc_on_worker``; the buffer's layout is ``rlgen.sync.ipc_buffer``).

The worker functions are pickled by reference, so they stay module-level functions of this importable module.
torch is imported inside the functions; importing this module imports neither vllm nor torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rlgen.sync.ipc_buffer import Chunk, IpcHandle, chunk_views, part_for

if TYPE_CHECKING:
    import torch

WEIGHT_CHUNK_BYTES = 1 << 30  # weights travel to the workers in chunks of about this size


def chunk_weights(
    items: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int = WEIGHT_CHUNK_BYTES
) -> Iterable[list[tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs into lists of about chunk_bytes each (a large tensor travels alone)."""
    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in items:
        nbytes = t.numel() * t.element_size()
        if chunk and size + nbytes > chunk_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, t))
        size += nbytes
    if chunk:
        yield chunk


def to_wire(name: str, t: torch.Tensor) -> tuple[str, str, list[int], bytes]:
    """A tensor as (name, dtype, shape, raw bytes): vLLM's RPC decoder rebuilds plain bytes, not tensors."""
    import torch

    t = t.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    return name, str(t.dtype).removeprefix("torch."), list(t.shape), raw


def from_wire(dtype: str, shape: list[int], raw: bytes) -> torch.Tensor:
    import torch

    if not raw:
        return torch.empty(shape, dtype=getattr(torch, dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer: the tensor is only read, then copied
        flat = torch.frombuffer(raw, dtype=torch.uint8)
    return flat.view(getattr(torch, dtype)).reshape(shape)


def load_weights_on_worker(worker: Any, weights: list[tuple[str, str, list[int], bytes]]) -> int:
    """Runs inside each vLLM worker (through collective_rpc): copy the tensors into the live model.

    The model's own load_weights maps Hugging Face names onto vLLM's fused layers (qkv, gate_up) and
    shards them for tensor parallelism; parameters keep their storage, so captured CUDA graphs stay valid.
    """
    import torch

    model = worker.get_model()
    device = next(model.parameters()).device
    with torch.no_grad():
        model.load_weights(
            (name, from_wire(dtype, shape, raw).to(device, non_blocking=True))
            for name, dtype, shape, raw in weights
        )
    torch.cuda.synchronize(device)
    return len(weights)


def receive_nccl_on_worker(worker: Any, update_info: dict[str, Any]) -> int:
    """Runs inside each vLLM worker (through collective_rpc): take one packed NCCL broadcast of the trainer's
    weights and load it straight into the live model, in place, as load_weights_on_worker does.

    vLLM's own sequence (start_weight_update, update_weights, finish_weight_update) runs a layerwise reload: it
    puts every layer back on the meta device, buffers each layer's weights until the layer is whole, builds it
    again and copies it into the old storage. Weights that are used as loaded need none of that; a model whose
    weights are processed after loading (quantized) still takes that way, in this same call.
    """
    import torch

    receiver = getattr(worker, "weight_transfer_engine", None)
    if receiver is None:
        raise RuntimeError("this vLLM engine was built without weight_transfer_config, so it cannot receive weights "
                           "over NCCL")
    if getattr(getattr(worker, "model_config", None), "quantization", None):
        worker.start_weight_update()
        worker.update_weights(update_info)
        worker.finish_weight_update()
    else:
        with torch.no_grad():
            receiver.update_weights(update_info)  # vLLM's packed receive into the model's load_weights; synchronises
    return len(update_info.get("names", ()))


def _open(worker: Any, handle: IpcHandle, device: torch.device) -> torch.Tensor:
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


def load_ipc_on_worker(worker: Any, handle: IpcHandle, chunk: Chunk, clone: bool = False) -> int:
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


__all__ = ["WEIGHT_CHUNK_BYTES", "chunk_weights", "from_wire", "load_ipc_on_worker", "load_weights_on_worker",
           "receive_nccl_on_worker", "to_wire"]
