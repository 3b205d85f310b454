"""A model's context extended with YaRN, as Qwen2.5 documents it: factor 4 over the 32,768 positions it was
trained on gives 131,072. The rotary parameters a built model folder gets, and the positions a Hugging Face
config.json holds (its max_position_embeddings times its YaRN factor). Pure: dicts and numbers, no imports."""

from __future__ import annotations

from typing import Any

YARN_FACTORS = (2.0, 4.0)  # the factors the plan picks from, smallest first (4: Qwen2.5's documented one)


def rope_parameters(theta: float, positions: int, yarn_factor: float | None) -> dict[str, Any]:
    """transformers' rope_parameters of a Qwen2 config: the default rotary embedding, or YaRN over positions
    (the positions the model was trained on) where yarn_factor is above 1."""
    if not yarn_factor or yarn_factor <= 1:
        return {"rope_type": "default", "rope_theta": theta}
    return {"rope_type": "yarn", "rope_theta": theta, "factor": float(yarn_factor),
            "original_max_position_embeddings": int(positions)}


def yarn_factor_of(hf: dict[str, Any]) -> float | None:
    """The YaRN factor a config.json's rope settings give (transformers 5's rope_parameters, or the older
    rope_scaling Qwen2.5's model cards write), None where it has none."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = hf.get(key)
        if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) == "yarn":
            factor = rope.get("factor")
            if isinstance(factor, (int, float)) and factor > 1:
                return float(factor)
    return None


def context_positions(hf: dict[str, Any]) -> int | None:
    """The positions a config.json's model holds: max_position_embeddings, times the YaRN factor where its rope
    settings extend it over the original positions (YaRN's own original_max_position_embeddings where given)."""
    base = hf.get("max_position_embeddings")
    if not isinstance(base, int) or base <= 0:
        return None
    factor = yarn_factor_of(hf)
    if factor is None:
        return base
    rope = next(r for r in (hf.get("rope_parameters"), hf.get("rope_scaling")) if isinstance(r, dict))
    original = rope.get("original_max_position_embeddings")
    return int((original if isinstance(original, int) and original > 0 else base) * factor)


__all__ = ["YARN_FACTORS", "context_positions", "rope_parameters", "yarn_factor_of"]
