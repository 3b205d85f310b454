"""LoRA on the learners, through PEFT: wrap a causal LM so only its adapters train, read the KL reference from the
same model with the adapters off, and export the policy two ways: the adapters alone (megabytes, for engines that
hold the base and take adapters) or the base with the adapters merged in, under the base's own tensor names (for
every other weight path). peft is imported when a learner is built with LoRA, never by the plan.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlgen.config import LORA_BLOCK_LINEARS

ADAPTER = "default"  # PEFT's name for a model's one adapter
PEFT_PREFIX = "base_model.model."  # what PEFT puts before the base model's parameter names


@dataclass(frozen=True)
class LoraSpec:
    """The plan's resolved LoRA settings, as plain values a Ray actor can take."""

    rank: int
    alpha: float
    dropout: float = 0.0
    target_modules: tuple[str, ...] = LORA_BLOCK_LINEARS


class LoraError(ValueError):
    """LoRA cannot be set up as asked; the message says how to fix it."""


def _peft() -> Any:
    try:
        import peft
    except ImportError as err:
        raise LoraError(f"LoRA needs the peft package: pip install 'rlgen[lora]' ({err}).") from err
    return peft


def wrap(model: nn.Module, spec: LoraSpec, path: str | None = None) -> nn.Module:
    """model with trainable LoRA adapters on spec.target_modules (every other parameter frozen): new ones, or
    those saved in the adapter folder at path (learner.lora.init, or a checkpoint's model folder)."""
    peft = _peft()
    if path:
        check_adapter_folder(path)
        try:
            return peft.PeftModel.from_pretrained(model, path, is_trainable=True)
        except (ValueError, RuntimeError, KeyError) as err:
            raise LoraError(f"the adapter in {path} does not fit this base model ({_first_line(err)}); point "
                            "learner.lora.init at an adapter trained on this model.") from err
    config = peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                             target_modules=list(spec.target_modules), bias="none", task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, config)
    except ValueError as err:
        have = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise LoraError(f"learner.lora.target_modules={list(spec.target_modules)} names modules the model does not "
                        f"have; its linear layers are {have}.") from err


def check_adapter_folder(path: str) -> None:
    if not os.path.isfile(os.path.join(path, "adapter_config.json")):
        raise LoraError(f"{path} is not a PEFT adapter folder (no adapter_config.json); point learner.lora.init at "
                        "the folder an adapter was saved to (a run's final_model/).")


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__


class AdapterOff(nn.Module):
    """The frozen base of a LoRA model, as a module: its forward runs `forward` (the PEFT model, or the DeepSpeed
    engine around it) with the PEFT model's adapters disabled. The KL reference, with no second copy of the
    weights."""

    def __init__(self, forward: nn.Module, peft: nn.Module):
        super().__init__()
        self._parts = [forward, peft]  # a list, so the wrapped model is not registered (and not trained) twice

    @property
    def wrapped(self) -> nn.Module:
        """The model whose forward this runs, adapters off."""
        return self._parts[0]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        forward, peft = self._parts
        with peft.disable_adapter():
            return forward(*args, **kwargs)


def base_name(name: str) -> str:
    """A PEFT parameter name -> the base model's (…q_proj.base_layer.weight -> …q_proj.weight)."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


@torch.no_grad()
def merged_weights(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(base model name, tensor) for every parameter of the base, with each LoRA layer's weight W + B A x scale.
    Lazy: one merged tensor at a time (a 7B model's merged weights never exist at once), new tensors, the model
    unchanged. Adapter parameters themselves are not yielded."""
    from peft.tuners.lora import LoraLayer

    layers = {f"{name}.base_layer.weight": module for name, module in model.named_modules()
              if isinstance(module, LoraLayer) and ADAPTER in module.lora_A}
    for name, param in model.named_parameters():
        if ".lora_" in name:
            continue
        t = param.detach()
        if name in layers:
            t = t + layers[name].get_delta_weight(ADAPTER).to(t.dtype)
        yield base_name(name), (t.to(dtype) if dtype is not None else t)


def base_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(base model name, parameter) of the base: the names and shapes merged_weights yields."""
    return [(base_name(n), p) for n, p in model.named_parameters() if ".lora_" not in n]


def adapter_weights(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The adapters as PEFT saves them (…q_proj.lora_A.weight), CPU copies, cast to dtype when given."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    return {k: v.detach().to("cpu", dtype=dtype if dtype is not None and v.is_floating_point() else v.dtype,
                             copy=True).contiguous() for k, v in state.items()}


def adapter_config(model: nn.Module) -> dict[str, Any]:
    """adapter_config.json's contents (JSON values)."""
    config = model.peft_config[ADAPTER].to_dict()
    return json.loads(json.dumps(config, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def save_merged(model: nn.Module, folder: str, dtype: torch.dtype | None = None) -> None:
    """The base with the adapters merged in, as a Hugging Face model folder."""
    base = model.get_base_model()
    state = {name: t.to("cpu") for name, t in merged_weights(model, dtype)}
    base.save_pretrained(folder, state_dict=state)


__all__ = ["AdapterOff", "LoraError", "LoraSpec", "adapter_config", "adapter_weights",
           "base_name", "base_parameters", "check_adapter_folder", "merged_weights", "save_merged", "wrap"]
