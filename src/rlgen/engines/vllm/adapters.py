"""LoRA adapters on a vllm engine: ``AdapterMethods``, the engine's calls for them (mixed into VLLMEngine): the
policy adapter a learner sends each version, named adapters loaded from folders (`rlgen serve`), and which one a
request runs with; and ``AdapterFolders``, where the engine keeps the policy versions it was sent: one folder per
version in memory-backed storage (/dev/shm where there is one), which vLLM's LoRA loader reads. The newest few
stay (vLLM may read an evicted one again for a request that started on it); the rest, and all of them when the
engine shuts down, are removed."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from rlgen.adapter_folder import write_adapter
from rlgen.engines.vllm.common import CONTROL_TIMEOUT_S, EngineError
from rlgen.types import GenRequest, Phase

KEEP = 4  # vLLM keeps this many adapters on the CPU (max_cpu_loras); their folders stay
NAMED_LORA_IDS = 1 << 30  # vLLM's ids of adapters loaded by name start here; policy versions use version + 1


class AdapterFolders:
    def __init__(self, name: str):
        self.name = name
        self.root: str | None = None
        self.versions: list[int] = []

    def write(self, version: int, tensors: dict[str, Any], config: dict[str, Any]) -> str:
        if self.root is None:
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            self.root = tempfile.mkdtemp(prefix=f"rlgen-{self.name}-lora-", dir=base)
        folder = os.path.join(self.root, f"v{version}")
        shutil.rmtree(folder, ignore_errors=True)  # a version sent again (an engine brought back) is rewritten
        write_adapter(folder, tensors, config)
        if version in self.versions:
            self.versions.remove(version)
        self.versions.append(version)
        return folder

    def prune(self) -> None:
        while len(self.versions) > KEEP and self.root:
            shutil.rmtree(os.path.join(self.root, f"v{self.versions.pop(0)}"), ignore_errors=True)

    def clear(self) -> None:
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root, self.versions = None, []


class AdapterMethods:
    """VLLMEngine's LoRA calls; they use its llm, _loop, args, name, version, lora_request, named_loras,
    _named_count and _adapters (an AdapterFolders)."""

    def _lora_of(self, req: GenRequest) -> Any:
        """The LoRARequest a request runs with: the named adapter it asks for, else the policy's (or none)."""
        if req.adapter is None:
            return self.lora_request
        return self._named(req.adapter)

    def _named(self, name: str) -> Any:
        if name not in self.named_loras:
            raise EngineError(f"no adapter named {name!r} is loaded; loaded: {sorted(self.named_loras) or 'none'}.")
        return self.named_loras[name]

    def _need_lora(self) -> None:
        if not self.args.get("enable_lora"):
            raise EngineError(f"{self.name} was built without LoRA; start it with engine.max_lora_rank set (a run sets "
                              "it under learner.lora.sync=adapter).")

    def add_adapter(self, name: str, path: str, timeout_s: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
        """Load the PEFT adapter folder at path under ``name``, for the requests that name it (vLLM reads it now,
        so an adapter it cannot take is refused here)."""
        from vllm.lora.request import LoRARequest

        self._need_lora()
        if name in self.named_loras:
            raise EngineError(f"an adapter named {name!r} is loaded already; unload it first or pick another name.")
        self._named_count += 1  # ids of named adapters lie above any policy version's (version + 1)
        request = LoRARequest(lora_name=name, lora_int_id=NAMED_LORA_IDS + self._named_count, lora_path=path)
        self._loop.run(self.llm.add_lora(request), timeout_s, f"{self.name}: loading LoRA adapter {name!r}")
        self.named_loras[name] = request
        return {"adapters": sorted(self.named_loras)}

    def remove_adapter(self, name: str, timeout_s: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
        request = self._named(name)
        del self.named_loras[name]
        self._loop.run(self.llm.remove_lora(request.lora_int_id), timeout_s, f"{self.name}: unloading adapter {name!r}")
        return {"adapters": sorted(self.named_loras)}

    def load_adapter(self, adapter: dict[str, Any], version: int, timeout_s: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
        """Take a new LoRA adapter version (``TorchLearner.get_adapter``'s dict): written to a per-version folder in
        memory-backed storage, loaded by vLLM beside the base, and used by every request from now on. Requests
        already running finish on the adapter they started with. Needs an engine built with enable_lora."""
        from vllm.lora.request import LoRARequest

        self._need_lora()
        t0 = time.time()
        folder = self._adapters.write(int(version), adapter["tensors"], adapter["config"])
        request = LoRARequest(lora_name=f"policy-v{int(version)}", lora_int_id=int(version) + 1, lora_path=folder)
        self._loop.run(self.llm.add_lora(request), timeout_s, f"{self.name}: loading LoRA adapter version {version}")
        self.lora_request, self.version = request, int(version)
        self._adapters.prune()
        t1 = time.time()
        return {"actor": self.name, "version": self.version, "spans": [(Phase.sync.value, t0, t1)], "seconds": t1 - t0,
                "bytes": sum(t.numel() * t.element_size() for t in adapter["tensors"].values())}
