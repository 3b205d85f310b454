"""Word reversal: "abcd>" -> "dcba"."""

from __future__ import annotations

from rlgen.config import TaskConfig
from rlgen.tasks.base import DrawnTask, Prompt, TaskDataError

SEPARATOR = ">"


class ReverseTask(DrawnTask):
    name = "reverse"

    def __init__(self, cfg: TaskConfig):
        if cfg.length < 1:
            raise TaskDataError(f"task.length={cfg.length}; it must be at least 1.")
        if not cfg.alphabet or SEPARATOR in cfg.alphabet:
            raise TaskDataError(
                f"task.alphabet={cfg.alphabet!r}; it must be a non-empty string of letters without {SEPARATOR!r}."
            )
        if cfg.length + len(SEPARATOR) > cfg.max_prompt_tokens:
            raise TaskDataError(
                f"task.length={cfg.length} gives prompts of {cfg.length + len(SEPARATOR)} characters, more than "
                f"task.max_prompt_tokens={cfg.max_prompt_tokens}; raise max_prompt_tokens or lower length."
            )
        super().__init__(cfg)
        self.length = cfg.length
        self.alphabet = cfg.alphabet

    def _draw(self, rng, n: int) -> list[Prompt]:
        out = []
        for _ in range(n):
            word = "".join(rng.choice(self.alphabet) for _ in range(self.length))
            out.append(Prompt(word + SEPARATOR, word[::-1]))
        return out
