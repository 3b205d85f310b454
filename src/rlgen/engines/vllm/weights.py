"""Weights on their way into a running vLLM engine: chunking, the wire format (raw bytes, which vLLM's RPC
decoder passes through untouched) and the function each vLLM worker runs through ``collective_rpc`` to load
them.

``load_weights_on_worker`` is pickled by reference, so it stays a module-level function of this importable
module. torch is imported inside the functions; importing this module imports neither vllm nor torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

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


__all__ = ["WEIGHT_CHUNK_BYTES", "chunk_weights", "from_wire", "load_weights_on_worker", "receive_nccl_on_worker",
           "to_wire"]
