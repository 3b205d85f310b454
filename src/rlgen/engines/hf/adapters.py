"""LoRA adapters on the hf engine, through PEFT, injected into the engine's own model (no second copy):

- the policy adapter, the one a trainer sends each version (learner.lora.sync=adapter, or a server's
  /weights/adapter); requests that name no adapter run on it;
- named adapters, loaded from PEFT folders (`rlgen serve`'s /v1/load_lora_adapter) and used by the requests
  that name them.

Until the first adapter arrives the model is untouched and peft is not imported. A request runs with one adapter
active, or with all of them off (the base)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rlgen.adapter_folder import read_adapter_config

POLICY = "rlgen-policy"  # the policy adapter's name inside the PEFT model; never a served name


class AdapterError(ValueError):
    """An adapter that cannot be loaded as asked; the message says why and how to fix it."""


def read_adapter_folder(path: str) -> dict[str, Any]:
    """A PEFT adapter folder -> {"tensors", "config"} (adapter_model.safetensors and adapter_config.json)."""
    from safetensors.torch import load_file

    config, why = read_adapter_config(path)
    tensors_file = os.path.join(path, "adapter_model.safetensors")
    if why or not os.path.isfile(tensors_file):
        raise AdapterError(f"{path} {why or 'has no adapter_model.safetensors'}; give the folder an adapter was "
                           "saved to.")
    try:
        return {"tensors": load_file(tensors_file), "config": config}
    except (OSError, ValueError) as err:
        raise AdapterError(f"the adapter in {path} cannot be read ({err}).") from err


class EngineAdapters:
    """The adapters of one engine's model: the policy adapter and named ones."""

    def __init__(self, model: nn.Module):
        self.base = model
        self.peft: Any = None  # the PeftModel around `base`, made with the first adapter
        self.named: dict[str, str] = {}  # name -> the folder it came from
        self.policy: str | None = None  # the policy adapter's config, as JSON, when one is loaded
        # PEFT freezes the base and its unload() leaves it frozen; the flags go back with the last adapter, since
        # they change CPU kernels' rounding (logprobs moved by about 1e-7 after a load and unload)
        self._requires_grad: dict[str, bool] = {}

    def names(self) -> list[str]:
        return sorted(self.named)

    # -- loading -------------------------------------------------------------------------------------------
    def load_policy(self, adapter: dict[str, Any]) -> None:
        """Make ``adapter`` ({"tensors", "config"}) the policy: its tensors are copied into the policy adapter,
        which is (re)made only when the config changes."""
        key = json.dumps(_lora_fields(adapter["config"]), sort_keys=True)
        if self.policy != key:
            self._drop(POLICY)
            self.policy = None
            self._add(POLICY, adapter["config"])
        try:
            self._set(POLICY, adapter["tensors"])
        except AdapterError:
            self._drop(POLICY)
            self.policy = None
            raise
        self.policy = key

    def add(self, name: str, path: str) -> None:
        """Load the adapter folder at path under ``name``."""
        if name in self.named:
            raise AdapterError(f"an adapter named {name!r} is loaded already; unload it first or pick another name.")
        adapter = read_adapter_folder(path)
        self._add(name, adapter["config"])
        try:
            self._set(name, adapter["tensors"])
        except AdapterError:
            self._drop(name)
            raise
        self.named[name] = path

    def remove(self, name: str) -> None:
        if name not in self.named:
            raise AdapterError(f"no adapter named {name!r} is loaded; loaded: {self.names() or 'none'}.")
        self._drop(name)
        del self.named[name]

    def _add(self, name: str, config: dict[str, Any]) -> None:
        from peft import LoraConfig, get_peft_model

        fields = {**config, "inference_mode": True, "lora_dropout": 0.0,
                  "base_model_name_or_path": getattr(self.base, "name_or_path", None)}
        try:
            lora = LoraConfig.from_peft_type(**fields)
        except (TypeError, ValueError, KeyError) as err:
            raise AdapterError(f"the adapter's config is not a LoRA config PEFT reads ({err}).") from err
        try:
            if self.peft is None:
                self._requires_grad = {n: p.requires_grad for n, p in self.base.named_parameters()}
                self.peft = get_peft_model(self.base, lora, adapter_name=name)
            else:
                self.peft.add_adapter(name, lora)
        except ValueError as err:
            self._drop(name)
            raise AdapterError(f"the adapter does not fit this model: {str(err).splitlines()[0][:300]}") from err
        self.peft.eval()

    def _set(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        """Copy saved adapter tensors (PEFT's file names) into adapter ``name``, after checking every name
        and shape, so a wrong adapter changes nothing."""
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        want = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(self.peft, adapter_name=name).items()}
        got = {k: tuple(v.shape) for k, v in tensors.items()}
        missing, unexpected = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        wrong = [k for k in want.keys() & got.keys() if want[k] != got[k]]
        if missing or unexpected or wrong:
            detail = (f"{wrong[0]} is {got[wrong[0]]}, this model's is {want[wrong[0]]}" if wrong else
                      f"missing {missing[:2]}" if missing else f"unexpected {unexpected[:2]}")
            raise AdapterError(f"the adapter does not fit this model ({detail}); it was trained on another base.")
        set_peft_model_state_dict(self.peft, tensors, adapter_name=name)

    def _drop(self, name: str) -> None:
        if self.peft is None or name not in self.peft.peft_config:
            return
        if len(self.peft.peft_config) > 1:
            self.peft.delete_adapter(name)
        else:  # the last one: take the LoRA layers out, leaving the model as it was
            self.peft.unload()
            self.peft = None
            for n, p in self.base.named_parameters():
                p.requires_grad_(self._requires_grad.get(n, p.requires_grad))

    # -- use -----------------------------------------------------------------------------------------------
    def check(self, name: str | None) -> None:
        if name is not None and name not in self.named:
            raise AdapterError(f"no adapter named {name!r} is loaded; loaded: {self.names() or 'none'}.")

    @contextmanager
    def active(self, name: str | None) -> Iterator[None]:
        """The model's forward runs with adapter ``name`` (None: the policy adapter, or the base when there is
        none) while the block runs."""
        self.check(name)
        name = name or (POLICY if self.policy else None)
        if self.peft is None:
            yield
        elif name is None:
            with self.peft.disable_adapter():
                yield
        else:
            self.peft.set_adapter(name, inference_mode=True)
            yield

    def base_names(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Whole-model weights under the base's own names -> the names they have with LoRA layers injected
        (…q_proj.weight -> …q_proj.base_layer.weight)."""
        if self.peft is None:
            return state
        keys = set(self.base.state_dict())
        out = {}
        for k, v in state.items():
            head, _, leaf = k.rpartition(".")
            out[k if k in keys or f"{head}.base_layer.{leaf}" not in keys else f"{head}.base_layer.{leaf}"] = v
        return out


def _lora_fields(config: dict[str, Any]) -> dict[str, Any]:
    """What makes two adapters' layers the same shape and scale."""
    targets = config.get("target_modules")
    return {"r": config.get("r"), "lora_alpha": config.get("lora_alpha"),
            "target_modules": sorted(targets) if isinstance(targets, list) else targets,
            "use_rslora": config.get("use_rslora", False)}


__all__ = ["POLICY", "AdapterError", "EngineAdapters", "read_adapter_folder"]
