"""The model's context: its positions (max_position_embeddings, times model.yarn_factor where YaRN extends them)
and the YaRN factor a config leaves null. A preset whose longest sequence is past its positions gets the smallest
factor of rlgen.rope.YARN_FACTORS that holds it, as Qwen2.5 documents for 131,072 tokens; the built folder's
config then says so to the engine and the learner alike. A folder of one's own (model.path) runs as its
config.json says: the plan reads its factor and refuses one the folder does not have. Pure: no torch."""

from __future__ import annotations

import math

from rlgen.config import ModelConfig, RunConfig, Setting, set_key
from rlgen.rope import YARN_FACTORS

PROMPT_GUESS = 64  # task.max_prompt_tokens left null: the most the task bounds give a prompt (plan.task_bounds)


def positions(m: ModelConfig) -> int:
    """The tokens a sequence of this model may have."""
    factor = m.yarn_factor if m.yarn_factor and math.isfinite(m.yarn_factor) and m.yarn_factor > 1 else 1.0
    return int(m.max_position_embeddings * factor)


def _longest(cfg: RunConfig) -> int:
    from rlgen.plan.memory import response_bound

    prompt = cfg.task.max_prompt_tokens if cfg.task.max_prompt_tokens is not None else PROMPT_GUESS
    return prompt + (response_bound(cfg)[1] or 0)


def fill_context(cfg: RunConfig, given: float | None, p: list[str]) -> tuple[RunConfig, list[Setting]]:
    """cfg with model.yarn_factor resolved where a preset's longest sequence needs it; given: the config's
    model.yarn_factor before the model folder's config.json was read. Problems go to p."""
    m = cfg.model
    if given is not None and not math.isfinite(given):
        return cfg, []  # the value checks say so
    if given is not None and given < 1:
        p.append(f"model.yarn_factor={given} must be at least 1 (1: no YaRN; left out, the plan picks).")
        return cfg, []
    if m.path:
        has = m.yarn_factor or 1.0
        if given is not None and given != has:
            p.append(f"model.yarn_factor={given:g} asks for YaRN over model.path's {m.max_position_embeddings} "
                     f"positions, but its config.json has {'factor ' + format(has, 'g') if has > 1 else 'none'}; the "
                     "folder decides what the engine and the learner run: add \"rope_scaling\": {\"type\": \"yarn\", "
                     f"\"factor\": {given:g}, \"original_max_position_embeddings\": {m.max_position_embeddings}}} to "
                     "its config.json (as Qwen2.5 documents), or leave model.yarn_factor out.")
        return cfg, ([Setting("model.yarn_factor", has, "the model folder's config.json")] if has > 1 else [])
    if given is not None:
        return cfg, [Setting("model.yarn_factor", given, "config")] if given > 1 else []
    need = _longest(cfg)
    if need <= m.max_position_embeddings:
        return cfg, []
    factor = next((f for f in YARN_FACTORS if need <= m.max_position_embeddings * f), None)
    if factor is None:
        return cfg, []  # no factor holds it: check_lengths says so, with the fixes
    why = (f"derived: the longest sequence ({need} tokens) is past model {m.name}'s {m.max_position_embeddings} "
           f"positions; YaRN x{factor:g} gives {int(m.max_position_embeddings * factor)}, as Qwen2.5 documents")
    return set_key(cfg, "model.yarn_factor", factor), [Setting("model.yarn_factor", factor, why)]


__all__ = ["fill_context", "positions"]
