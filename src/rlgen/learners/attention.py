"""Attention over packed rows: several sequences back to back in one row of tokens, each attending causally to
its own tokens only. The learner's models run it through transformers' attention interface (a registered
function per backend, chosen by the plan: ``learner.attention``); each forward passes the rows' boundaries as
``packed_segments=(cu_seqlens [k+1] int32, longest)``, and under sequence parallelism a third part, the rank's
sequence group, with which each rank holds a slice of the row's tokens (rlgen.learners.ulysses); a forward
without them takes each row as one whole sequence (no padding).

Backends, fastest first (``rlgen.plan.attention`` picks the first one present; ``rlgen.learners.registry``
lists their names for the plan, which imports no torch):
- ``flash_attn``: flash-attn's varlen kernel, when the package is installed (CUDA);
- ``torch_varlen``: PyTorch's own varlen FlashAttention (torch.nn.attention.varlen, torch 2.10 and later; CUDA);
- ``sdpa_segments``: scaled_dot_product_attention on each sequence in turn, causal: runs anywhere (the CPU
  path, and the reference the others are tested against).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from rlgen.learners.ulysses import sharded_attention

PREFIX = "rlgen_packed_"  # transformers' name of a backend: PREFIX + backend


class PackedAttentionError(RuntimeError):
    """A packed forward of several rows, or of a layer or scale the backends cannot take."""


def _check(module: nn.Module, kwargs: dict[str, Any]) -> None:
    if getattr(module, "sliding_window", None) or kwargs.get("sliding_window"):
        raise PackedAttentionError("packed attention has no sliding window; this model's layer uses one.")


def sdpa_segments(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
                  scale: float) -> torch.Tensor:
    """q [T, H, D], k and v [T, Hkv, D] -> [T, H, D]: causal attention within each [cu[i], cu[i+1])."""
    out = torch.empty_like(q)
    gqa = q.shape[1] != k.shape[1]
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if b > a:
            qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))  # [H, t, D]
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa)
            out[a:b] = o.transpose(0, 1)
    return out


def torch_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
                 scale: float) -> torch.Tensor:
    """PyTorch's varlen FlashAttention. Its signature moved between releases: causal is is_causal=True (2.10,
    2.11) or window_size=(-1, 0) (later); kv heads are repeated where it takes no enable_gqa; scale is passed
    where it takes one (else it must be the default 1/sqrt(D))."""
    from torch.nn.attention.varlen import varlen_attn

    params = _varlen_params()
    kw: dict[str, Any] = {}
    if "window_size" in params:
        kw["window_size"] = (-1, 0)
    else:
        kw["is_causal"] = True
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if "scale" in params:
        kw["scale"] = scale
    elif abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        raise PackedAttentionError(f"this torch's varlen_attn takes no scale, and the model's {scale} is not "
                                   "1/sqrt(head_dim); use learner.attention=sdpa_segments.")
    return varlen_attn(q, k, v, cu, cu, longest, longest, **kw)


_PARAMS: list[frozenset[str]] = []


def _varlen_params() -> frozenset[str]:
    if not _PARAMS:
        from torch.nn.attention.varlen import varlen_attn

        _PARAMS.append(frozenset(inspect.signature(varlen_attn).parameters))
    return _PARAMS[0]


def flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
               scale: float) -> torch.Tensor:
    """flash-attn's varlen kernel (grouped kv heads natively)."""
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, softmax_scale=scale, causal=True)


Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor]
BACKENDS: dict[str, Kernel] = {"flash_attn": flash_attn, "torch_varlen": torch_varlen,
                               "sdpa_segments": sdpa_segments}  # the names of registry.ATTENTION_BACKENDS


def _interface(kernel: Kernel) -> Callable[..., tuple[torch.Tensor, None]]:
    """A transformers attention function around a kernel: query [1, H, T, D], key and value [1, Hkv, T, D]
    -> ([1, T, H, D], None), within the rows' boundaries (packed_segments); without them, causal over each of
    the B rows, [B, H, T, D] -> [B, T, H, D]. The attention mask is not read."""

    def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                  **kwargs: Any) -> tuple[torch.Tensor, None]:
        _check(module, kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        segments = kwargs.get("packed_segments")
        if segments is None:  # no boundaries: each row is one whole sequence, unpadded
            out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale,
                                                 enable_gqa=query.shape[1] != key.shape[1])  # [B, H, T, D]
            return out.transpose(1, 2), None
        if query.shape[0] != 1:
            raise PackedAttentionError(f"packed attention takes one row of packed tokens, not {query.shape[0]} "
                                       "rows (rlgen.learners.packed packs a micro-batch into one).")
        cu, longest, *group = segments  # a third part: this rank's sequence group (rlgen.learners.ulysses)
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
        if group and group[0] is not None:  # T is this rank's slice of the row, cu the whole row's
            out = sharded_attention(kernel, q, k, v, cu, int(longest), float(scale), group[0])
        else:
            out = kernel(q, k, v, cu, int(longest), float(scale))  # [T, H, D]
        return out.unsqueeze(0), None

    return attention


def use_packed_attention(model: nn.Module, backend: str) -> None:
    """Make model (a transformers causal LM, or a wrapper around one) run `backend` over packed rows in every
    forward from now on."""
    from transformers import AttentionInterface

    if backend not in BACKENDS:
        raise ValueError(f"learner.attention={backend} is not one of {', '.join(BACKENDS)}")
    name = PREFIX + backend
    AttentionInterface.register(name, _interface(BACKENDS[backend]))
    set_impl = getattr(model, "set_attn_implementation", None)
    if set_impl is not None:
        set_impl(name)
    else:
        model.config._attn_implementation = name


__all__ = ["BACKENDS", "PackedAttentionError", "sdpa_segments", "torch_varlen", "use_packed_attention"]
