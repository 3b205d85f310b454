"""A tiled MLP: each decoder layer's MLP over a long packed row a tile of tokens at a time, each tile recomputed in
backward rather than kept, so the MLP's widest activations ([tokens, intermediate] three times over, the largest
a layer makes) exist for one tile at once, never for the whole row. The MLP works token by token, so the result
and every gradient are the untiled ones. DeepSpeed's ALST tiles its MLP the same way; this one patches the
module's forward in place (parameter names, LoRA's wrapped layers and DeepSpeed's hooks stay as they are) and
runs on CPU as on GPUs.
"""

from __future__ import annotations

import functools
import types

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlgen.microbatches import TILE_TOKENS


def _tiled_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x [B, T, H] -> [B, T, H], self._rlgen_tile tokens at a time along T. The untiled forward is the class's,
    so a copy of the model (a frozen reference) tiles its own weights."""
    untiled = functools.partial(type(self).forward, self)
    tokens = self._rlgen_tile
    if x.dim() < 2 or x.shape[-2] <= tokens:
        return untiled(x)
    tiles = x.split(tokens, dim=-2)
    if torch.is_grad_enabled():
        return torch.cat([checkpoint(untiled, t, use_reentrant=False) for t in tiles], dim=-2)
    return torch.cat([untiled(t) for t in tiles], dim=-2)


def tile_mlps(model: nn.Module, tokens: int = TILE_TOKENS) -> int:
    """Make every decoder layer's MLP (a child module named ``mlp``) of model run tiled from now on; returns how
    many were tiled. Tiling twice keeps the first tiling."""
    count = 0
    for module in model.modules():
        mlp = getattr(module, "mlp", None)
        if isinstance(mlp, nn.Module) and not hasattr(mlp, "_rlgen_tile"):
            mlp._rlgen_tile = int(tokens)
            mlp.forward = types.MethodType(_tiled_forward, mlp)
            count += 1
    return count


__all__ = ["TILE_TOKENS", "tile_mlps"]
