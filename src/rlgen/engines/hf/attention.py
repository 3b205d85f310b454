"""The hf engine's attention: scaled_dot_product_attention with grouped key/value heads repeated up front, so that
torch can pick its memory-efficient kernel in float32 (the validation reference) and over long prompts. With
grouped heads passed as they are (enable_gqa), torch takes only its flash kernel (16-bit) or the math kernel,
which holds [heads, T, T] scores: 192 GiB for one 65,536-token row of the 1.5B in float32. Masks are made as for
"sdpa" (none for an unpadded row, which then runs causal)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

NAME = "rlgen_causal_sdpa"


def causal_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [B, H, q, D], key and value [B, Hkv, k, D] -> ([B, q, H, D], None). A 4D mask (padded rows) is applied
    as given; without one, a prefill (q = k) is causal and a decode step (q = 1 against a cache) sees every key."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    mask = attention_mask
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        mask = mask[:, :, :, : key.shape[-2]]
    causal = mask is None and query.shape[2] == key.shape[2] and query.shape[2] > 1
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=causal, scale=scaling,
                                         dropout_p=dropout if module.training else 0.0)
    return out.transpose(1, 2).contiguous(), None


def use_causal_sdpa(model: nn.Module) -> None:
    """Run model's attention through causal_sdpa from now on (its masks made as for sdpa)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, causal_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)


__all__ = ["causal_sdpa", "use_causal_sdpa"]
