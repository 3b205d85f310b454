"""The driver's side of weight sync: one interface (``WeightTransport``, in ``base``), one transport for each
``plan.transport`` (``rlgen.runtime.start.transport.make_transport`` picks it): Ray's object store (CPU, hf engines:
``object_store``), vLLM's NCCL weight transfer (engines on GPUs of their own: ``vllm_nccl``), a resident CUDA IPC buffer (colocated: ``ipc``), or LoRA
adapters (``learner.lora.sync=adapter``: ``adapter``). ``start()`` sends the starting weights once during set-up,
so the first update's one-off costs stay out of step 0. Every wait has a timeout; a transport whose NCCL or IPC call
timed out marks itself broken and fails every later push at once. vllm is imported lazily.
docs/weight_sync.md has each transport step by step."""

from __future__ import annotations

from rlgen.sync.transports.adapter import AdapterTransport
from rlgen.sync.transports.base import PushResult, TransportBase, WeightTransport
from rlgen.sync.transports.ipc import CudaIpcTransport
from rlgen.sync.transports.object_store import ObjectStoreTransport
from rlgen.sync.transports.vllm_nccl import VllmNcclTransport

__all__ = ["AdapterTransport", "CudaIpcTransport", "VllmNcclTransport", "ObjectStoreTransport", "PushResult",
           "TransportBase", "WeightTransport"]
