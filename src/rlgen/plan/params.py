"""A Qwen2-architecture model's parameters, counted from its shape (ModelConfig). Pure arithmetic."""

from __future__ import annotations

from rlgen.charvocab import CHAR_VOCAB_SIZE


def count_params(m) -> tuple[int, int]:
    """(parameters, vocab size) of a Qwen2-architecture preset, counted from its shape."""
    vocab = m.vocab_size or CHAR_VOCAB_SIZE
    h, inter, layers = m.hidden_size, m.intermediate_size, m.num_layers
    head_dim = h // max(m.num_heads, 1)
    kv = m.num_kv_heads * head_dim
    attn = (h * h + h) + 2 * (h * kv + kv) + h * h  # q (bias), k and v (bias), o
    mlp = 3 * h * inter
    per_layer = attn + mlp + 2 * h  # two RMSNorms
    params = vocab * h + layers * per_layer + h + (0 if m.tie_word_embeddings else vocab * h)
    return params, vocab


__all__ = ["count_params"]
