"""The task's token bounds a config leaves null (the presets of multi-turn environments do), fitted to the
sequence the model holds: its positions, or engine.max_model_len where that is set and fewer. A model with room
gets PROMPT_CAP prompt tokens and EPISODE_CAP after them; a smaller one a fifth of its room for the prompt and the
rest after it. Where the config sets one of the two, the other gets what it leaves (up to its cap). A value the
config sets always wins. Pure: JSON only, no torch."""

from __future__ import annotations

from rlgen.config import RunConfig, Setting, set_key
from rlgen.plan.context import positions
from rlgen.plan.model_folder import with_model_folder

PROMPT_CAP = 64  # task.max_prompt_tokens left null, on a model with room
EPISODE_CAP = 256  # task.max_total_tokens left null, on a model with room
PROMPT_SHARE = 5  # a model with less room: 1/5 of it for the prompt


def room_of(cfg: RunConfig) -> tuple[int, str]:
    """The tokens a sequence may have, and what sets that."""
    m = with_model_folder(cfg).model
    room, why = positions(m), f"model {m.name}'s max_position_embeddings={m.max_position_embeddings}"
    if room > m.max_position_embeddings:
        why += f" with YaRN x{m.yarn_factor:g} ({room})"
    if cfg.engine.max_model_len and cfg.engine.max_model_len < room:
        room, why = cfg.engine.max_model_len, f"engine.max_model_len={cfg.engine.max_model_len}"
    return room, why


def fitted_bounds(room: int, prompt: int | None, total: int | None) -> tuple[int, int]:
    """(task.max_prompt_tokens, task.max_total_tokens) for a sequence of room tokens, those given kept."""
    share = max(1, min(PROMPT_CAP, room // PROMPT_SHARE))
    if prompt is None:
        left = room - total if total is not None else 0
        prompt = min(PROMPT_CAP, left) if left >= 1 else share
    if total is None:
        left = room - prompt
        total = min(EPISODE_CAP, left) if left >= 1 else max(1, min(EPISODE_CAP, room - share))
    return prompt, total


def fill_task_bounds(cfg: RunConfig) -> tuple[RunConfig, list[Setting]]:
    """cfg with task.max_prompt_tokens and task.max_total_tokens filled where null, and a Setting for each."""
    t = cfg.task
    if t.max_prompt_tokens is not None and t.max_total_tokens is not None:
        return cfg, []
    room, why = room_of(cfg)
    prompt, total = fitted_bounds(room, t.max_prompt_tokens, t.max_total_tokens)
    settings = []
    for key, value, given, cap in (("task.max_prompt_tokens", prompt, t.max_prompt_tokens, PROMPT_CAP),
                                   ("task.max_total_tokens", total, t.max_total_tokens, EPISODE_CAP)):
        if given is None:
            cfg = set_key(cfg, key, value)
            settings.append(Setting(key, value, f"derived: fits {why} (up to {cap})"))
    return cfg, settings


__all__ = ["EPISODE_CAP", "PROMPT_CAP", "fill_task_bounds", "fitted_bounds", "room_of"]
