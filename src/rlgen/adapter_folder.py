"""A PEFT adapter folder (adapter_config.json beside adapter_model.safetensors): what a LoRA learner's checkpoint
holds, what a vllm engine loads an adapter version from, and what ``rlgen plan`` and ``rlgen serve`` check a
user's adapter against. safetensors is imported only when a folder is written."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def write_adapter(folder: str, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """A PEFT adapter folder (adapter_config.json, adapter_model.safetensors) from a LoRA adapter's tensors and
    config: what a learner's checkpoint holds and what a vllm engine loads."""

    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def read_adapter_config(folder: str) -> tuple[dict[str, Any] | None, str | None]:
    """(adapter_config.json of the PEFT adapter folder, None), or (None, why it cannot be read: the end of a
    sentence that starts with the folder)."""

    path = os.path.join(os.path.expanduser(folder), "adapter_config.json")
    if not os.path.isfile(path):
        return None, "is not a PEFT adapter folder (no adapter_config.json there)"
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError) as err:
        return None, f"has an adapter_config.json that cannot be read as JSON ({err})"
    return (value if isinstance(value, dict) else {}), None


__all__ = ["read_adapter_config", "write_adapter"]
