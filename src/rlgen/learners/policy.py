"""The models and optimizer every learner starts from: the policy loaded from its folder with dropout off,
optionally wrapped in LoRA adapters, its AdamW optimizer, and a frozen KL reference. transformers is imported
when a model is loaded."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
from torch import nn

from rlgen.config import AlgoConfig
from rlgen.learners.attention import use_packed_attention
from rlgen.learners.lora import LoraSpec, wrap
from rlgen.learners.tiling import tile_mlps


def disable_dropout(model: nn.Module) -> None:
    """Zero dropout modules and the float attention-dropout rates HF attention layers read in train mode."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def deterministic_algorithms() -> None:
    """torch's deterministic algorithms for this process (deterministic=true), before its first CUDA work: cuBLAS's
    fixed workspace, cuDNN without autotuning. An op without a deterministic kernel warns rather than fails, so a
    run records where determinism ends rather than stopping there."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def load_policy(model_path: str, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The HF causal LM of the folder, in dtype on device, with dropout off."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
    disable_dropout(model)
    return model


def with_lora(model: nn.Module, lora: dict[str, Any], resume_from: str | None, lora_init: str | None) -> nn.Module:
    """The model wrapped in LoRA adapters (LoraSpec's fields): those of a resumed checkpoint's model folder, else
    of the adapter folder lora_init (learner.lora.init), else new ones. Only the adapters train."""
    adapter = os.path.join(resume_from, "model") if resume_from else lora_init
    return wrap(model, LoraSpec(**lora), adapter)


def frozen_model(source: str | nn.Module, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """A frozen copy (eval mode, no gradients) on device of a model folder, loaded in dtype, or of a model."""
    if isinstance(source, str):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    else:
        model = copy.deepcopy(source)
    return model.to(device).eval().requires_grad_(False)


def frozen_reference(source: str | nn.Module, dtype: torch.dtype, device: torch.device, attention: str,
                     tiled_mlp: bool = False) -> nn.Module:
    """The KL reference of a learner without LoRA: frozen_model of source with the learner's packed-attention
    backend, and its MLPs tiled as the learner's are (with LoRA the reference is the policy with its adapters off,
    rlgen.learners.lora.AdapterOff)."""
    model = frozen_model(source, dtype, device)
    use_packed_attention(model, attention)
    if tiled_mlp:
        tile_mlps(model)
    return model


def adamw(model: nn.Module, algo: AlgoConfig) -> tuple[list[nn.Parameter], torch.optim.AdamW]:
    """The model's trainable parameters and torch's AdamW over them, at algo.lr and algo.weight_decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    return params, torch.optim.AdamW(params, lr=algo.lr, weight_decay=algo.weight_decay)


__all__ = ["adamw", "disable_dropout", "frozen_model", "frozen_reference", "load_policy", "with_lora"]
