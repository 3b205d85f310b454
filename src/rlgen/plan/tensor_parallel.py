"""What tensor parallelism splits, as vLLM shards a Qwen2/Llama-style model over engine.tensor_parallel_size GPUs:
the attention heads, the KV heads (divided, or copied onto TP / num_kv_heads GPUs each when TP is a multiple of
their count), the MLP's intermediate width, and the vocabulary rows of the embedding and LM head (padded first to
a multiple of VOCAB_PADDING, so it is the padded count that must divide). The hidden size is not split. Pure: no
torch."""

from __future__ import annotations

from typing import Any

from rlgen.charvocab import CHAR_VOCAB_SIZE

VOCAB_PADDING = 64  # vLLM pads the vocabulary rows to a multiple of this, then gives each GPU an equal part


def padded_vocab(vocab: int) -> int:
    """The vocabulary rows vLLM splits: vocab rounded up to a multiple of VOCAB_PADDING."""
    return -(-vocab // VOCAB_PADDING) * VOCAB_PADDING


def kv_groups(num_kv_heads: int, tp: int) -> int:
    """Over how many GPUs the KV heads split (each GPU keeps num_kv_heads / this many): tp when tp divides them,
    num_kv_heads when tp is a multiple of them (vLLM copies each KV head onto tp / num_kv_heads GPUs)."""
    return max(min(tp, num_kv_heads), 1)


def _divided(m: Any) -> dict[str, tuple[int, str]]:
    """The dimensions TP must divide: key -> (the count it splits, the dimension in words, with its key)."""
    vocab = m.vocab_size or CHAR_VOCAB_SIZE
    pad = f" padded to {padded_vocab(vocab):,}" if padded_vocab(vocab) != vocab else ""
    return {
        "model.num_heads": (m.num_heads, f"{m.num_heads} attention heads (model.num_heads)"),
        "model.intermediate_size": (m.intermediate_size,
                                    f"MLP width {m.intermediate_size:,} (model.intermediate_size)"),
        "model.vocab_size": (padded_vocab(vocab), f"vocabulary of {vocab:,} rows{pad} (model.vocab_size; vLLM pads "
                                                  f"it to a multiple of {VOCAB_PADDING})"),
    }


def unsplit(m: Any, tp: int) -> list[str]:
    """The keys of model m's dimensions (a ModelConfig's) that do not split over tp GPUs; empty: it shards."""
    bad = [key for key, (count, _) in _divided(m).items() if count % tp]
    kv = m.num_kv_heads
    if kv > 0 and (tp % kv if tp > kv else kv % tp):
        bad.append("model.num_kv_heads")
    return bad


def tp_sizes(m: Any, most: int) -> list[int]:
    """The TP sizes from 1 to `most` that split every dimension of model m."""
    return [t for t in range(1, max(most, 1) + 1) if not unsplit(m, t)]


def tp_problem(m: Any, tp: int, most: int) -> str | None:
    """One sentence when model m does not split over tp GPUs, naming each dimension that does not and the TP sizes
    up to `most` (a node's GPUs) that do; None when it splits."""
    bad = unsplit(m, tp)
    if not bad:
        return None
    divided = _divided(m)
    words = [f"its {divided[k][1]}" for k in bad if k in divided]
    parts = [f"must divide {', '.join(words[:-1])}{' and ' if len(words) > 1 else ''}{words[-1]}"] if words else []
    if "model.num_kv_heads" in bad:
        parts.append(f"must divide its {m.num_kv_heads} KV heads (model.num_kv_heads) or be a multiple of them")
    return (f"engine.tensor_parallel_size={tp} does not shard model {m.name}: {tp} {', and '.join(parts)}; choose "
            f"a TP size that does: {', '.join(str(t) for t in tp_sizes(m, most))} (up to a node's {most} GPUs).")


__all__ = ["VOCAB_PADDING", "kv_groups", "padded_vocab", "tp_problem", "tp_sizes", "unsplit"]
