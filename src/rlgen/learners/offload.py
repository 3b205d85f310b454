"""Activation checkpoints kept in host memory: with gradient checkpointing each decoder layer keeps only its input
([tokens, hidden] in bf16) for the backward's recompute, and over a long row and many layers those inputs are what
is left of the activations. Offloaded, each goes to page-locked host memory as the forward passes the layer and
comes back when the backward recomputes it, so a GPU holds about one layer's. The gradients are the same; what
it costs is two copies over PCIe of every layer's input a step.

transformers' checkpointed layers call the function in their ``_gradient_checkpointing_func``; this sets it, on
every such layer, to torch's non-reentrant checkpoint under ``torch.autograd.graph.save_on_cpu``, whose hooks take
the checkpoint's saved inputs off the device.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def _offloaded_checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
    with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
        return checkpoint(function, *args, **kwargs)


def offload_checkpoints(model: nn.Module) -> int:
    """Make every gradient-checkpointed layer of model keep its checkpoint in host memory; returns how many layers.
    Raises ValueError where none is checkpointed (gradient checkpointing must be on first)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    func = functools.partial(_offloaded_checkpoint, use_reentrant=False)
    layers = [m for m in model.modules()
              if isinstance(m, GradientCheckpointingLayer) and getattr(m, "gradient_checkpointing", False)]
    if not layers:
        raise ValueError("offloaded checkpoints need gradient checkpointing on (learner.gradient_checkpointing=true)")
    for layer in layers:
        layer._gradient_checkpointing_func = func
    return len(layers)


__all__ = ["offload_checkpoints"]
