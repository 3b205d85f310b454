"""The shape of the model in model.path, read from its config.json, so the plan sizes memory, lengths and TP
splits from the real model rather than the preset. Pure: JSON only, no torch."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rlgen.config import ModelConfig, RunConfig
from rlgen.rope import yarn_factor_of

HF_FIELDS = {  # ModelConfig field <- a Hugging Face config.json key
    "hidden_size": "hidden_size", "intermediate_size": "intermediate_size", "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads", "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings", "tie_word_embeddings": "tie_word_embeddings",
}


def with_model_folder(cfg: RunConfig) -> RunConfig:
    """cfg with model.* read from model.path's config.json when it is a local folder (the plan sizes memory,
    lengths and TP splits from the real model, not the preset); cfg itself otherwise."""

    if not cfg.model.path:
        return cfg
    found = folder_model(cfg.model.path, cfg.model)
    return cfg if found is None else dataclasses.replace(cfg, model=found)


def folder_model(path: str, base: ModelConfig) -> ModelConfig | None:
    """base with the shape read from the config.json of the model folder at path; None where there is no readable
    one (the validation pass, or the teacher's check, says what is wrong with the folder)."""
    try:
        hf = json.loads((Path(path).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(hf, dict):
        return None
    hf = hf.get("text_config", hf) if isinstance(hf.get("text_config"), dict) else hf
    values = {field: hf[key] for field, key in HF_FIELDS.items() if isinstance(hf.get(key), (int, bool))}
    values["num_kv_heads"] = hf.get("num_key_value_heads") or values.get("num_heads", base.num_kv_heads)
    values["yarn_factor"] = yarn_factor_of(hf)  # None: the folder's rotary embedding is not extended
    values["name"] = Path(path).name
    return dataclasses.replace(base, **values)
