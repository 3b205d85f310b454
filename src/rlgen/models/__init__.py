"""Models built here: the character tokenizer, Qwen2 configs from the presets, cached builds with a warm start
(``build``), and a Hugging Face folder with a trained BPE tokenizer (``local``)."""

from rlgen.models.build import (
    BUILD_FORMAT,
    architectures,
    build_tokenizer,
    built_model,
    cache_key,
    file_digest,
    hf_config,
    load_tokenizer,
    prepare_model,
    warm_start,
)

__all__ = ["BUILD_FORMAT", "architectures", "build_tokenizer", "built_model", "cache_key", "file_digest", "hf_config", "load_tokenizer",
           "prepare_model", "warm_start"]
