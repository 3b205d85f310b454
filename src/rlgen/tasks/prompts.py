"""Prompt text -> the token ids an engine gets, and where a response ends.

``task.prompt_format`` is ``chat`` (the tokenizer's chat template), ``raw`` or ``auto``; a prompt over
``task.max_prompt_tokens`` is refused, left out or cut (``task.long_prompts``). A response ends at the model's
end-of-sequence ids, at ``task.stop_token_ids``, or after the first ``task.stop`` string (cut on the driver).
docs/tasks.md has each choice in full.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from rlgen.config import LongPrompts, PromptFormat, TaskConfig
from rlgen.tasks.base import TaskDataError
from rlgen.types import Completion


class PromptRenderer:
    def __init__(self, tokenizer: Any, cfg: TaskConfig, tools: list[dict[str, Any]] | None = None):
        """tools: the function schemas a chat template describes to the model (a tool-using task's)."""
        self.tokenizer, self.cfg, self.tools = tokenizer, cfg, tools or None
        fmt = PromptFormat(cfg.prompt_format)
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if fmt is PromptFormat.chat and not has_template:
            raise TaskDataError("task.prompt_format=chat, but the tokenizer has no chat template; use "
                                "task.prompt_format=raw, or a model folder whose tokenizer has one.")
        self.chat = fmt is PromptFormat.chat or (fmt is PromptFormat.auto and has_template)
        self.limit = cfg.max_prompt_tokens
        self.policy = LongPrompts(cfg.long_prompts)

    @property
    def format(self) -> str:
        return "chat" if self.chat else "raw"

    def ids(self, text: str) -> list[int]:
        """The whole rendered prompt's token ids (no length policy applied)."""
        system = self.cfg.system_prompt
        if self.chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     **({"tools": self.tools} if self.tools else {}))
            ids = out["input_ids"] if hasattr(out, "keys") else out
            return [int(i) for i in ids]
        if system:
            text = f"{system}\n\n{text}"
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def fits(self, text: str) -> bool:
        return len(self.ids(text)) <= self.limit

    def fit(self, ids: list[int]) -> list[int] | None:
        """ids within task.max_prompt_tokens: as they are, cut to the last ones (truncate), or None."""
        if len(ids) <= self.limit:
            return ids
        return ids[-self.limit :] if self.policy is LongPrompts.truncate else None


def model_stop_ids(model_path: str, tokenizer: Any, extra: list[int] | tuple[int, ...] = ()) -> list[int]:
    """End-of-sequence ids: generation_config.json's (an instruct model often has several), the tokenizer's,
    and the task's own stop_token_ids."""
    ids: list[int] = []
    gen = Path(model_path) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids += [int(x) for x in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    ids += [int(x) for x in extra]
    return list(dict.fromkeys(ids))


def length_stop_ids(vocab_size: int, mean: int, seed: int, keep: list[int] | tuple[int, ...] = ()) -> list[int]:
    """task.response_length_mean: vocab_size // mean token ids drawn with seed, none of them in keep (the
    pad and special ids). A model that samples near uniformly over its vocabulary (random weights) stops at one
    of them with probability about 1 / mean per token: geometric lengths of that mean. [] for mean <= 0."""
    if mean <= 0:
        return []
    skip = set(keep)
    pool = [t for t in range(vocab_size) if t not in skip]
    count = max(1, min(len(pool), vocab_size // mean))
    return sorted(random.Random(seed).sample(pool, count))


def cut_at_stop(c: Completion, tokenizer: Any, stops: list[str], text: str) -> tuple[Completion, str]:
    """The completion ended after the first stop string its text contains (at the token that completes it),
    with the decoded text of what stays; unchanged when it contains none."""
    if not stops or not any(s in text for s in stops):
        return c, text

    def has_stop(k: int) -> bool:
        t = tokenizer.decode(c.token_ids[:k], skip_special_tokens=True)
        return any(s in t for s in stops)

    lo, hi = 1, len(c.token_ids)  # the shortest prefix that holds a stop string (holding one is monotonic)
    while lo < hi:
        mid = (lo + hi) // 2
        if has_stop(mid):
            hi = mid
        else:
            lo = mid + 1
    cut = Completion(c.group_id, c.prompt_ids, c.token_ids[:lo], c.logprobs[:lo], "stop", c.version,
                     [(i, v) for i, v in c.version_changes if i < lo])
    return cut, tokenizer.decode(cut.token_ids, skip_special_tokens=True)
