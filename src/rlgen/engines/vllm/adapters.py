"""Where a vllm engine keeps the LoRA adapter versions it was sent: one folder per version in memory-backed storage
(/dev/shm where there is one), which vLLM's LoRA loader reads. The newest few stay (vLLM may read an evicted one
again for a request that started on it); the rest, and all of them when the engine shuts down, are removed."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

KEEP = 4  # vLLM keeps this many adapters on the CPU (max_cpu_loras); their folders stay


class AdapterFolders:
    def __init__(self, name: str):
        self.name = name
        self.root: str | None = None
        self.versions: list[int] = []

    def write(self, version: int, tensors: dict[str, Any], config: dict[str, Any]) -> str:
        from rlgen.transfer import write_adapter

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
