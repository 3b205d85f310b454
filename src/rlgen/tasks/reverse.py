"""Word reversal: "abcd>" -> "dcba"."""

from __future__ import annotations

from rlgen.config import TaskConfig
from rlgen.tasks.base import EVAL_PROMPTS_SYNTHETIC, BaseTask, Prompt, TaskDataError, step_rng

SEPARATOR = ">"


class ReverseTask(BaseTask):
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

    def prompts(self, step: int, n: int) -> list[Prompt]:
        return self._draw(step_rng(self.seed, "prompts", step), n)

    def extra_prompts(self, step: int, round: int, n: int) -> list[Prompt]:
        return self._draw(step_rng(self.seed, f"extra/{round}", step), n)

    def demonstrations(self, n: int, seed: int) -> list[Prompt]:
        return self._draw(step_rng(seed, "demos", 0), n)

    def eval_prompts(self) -> list[Prompt]:
        return self._draw(step_rng(self.seed, "eval", 0), EVAL_PROMPTS_SYNTHETIC)
