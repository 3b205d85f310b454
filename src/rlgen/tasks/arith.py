"""Two-operand addition: "a+b=" -> str(a + b)."""

from __future__ import annotations

from rlgen.config import TaskConfig
from rlgen.tasks.base import DrawnTask, Prompt, TaskDataError


class ArithTask(DrawnTask):
    name = "arith"

    def __init__(self, cfg: TaskConfig):
        if cfg.max_operand < 1:
            raise TaskDataError(f"task.max_operand={cfg.max_operand}; it must be at least 1.")
        longest = len(f"{cfg.max_operand - 1}+{cfg.max_operand - 1}=")
        if longest > cfg.max_prompt_tokens:
            raise TaskDataError(
                f"task.max_operand={cfg.max_operand} gives prompts of {longest} characters, more than "
                f"task.max_prompt_tokens={cfg.max_prompt_tokens}; raise max_prompt_tokens or lower max_operand."
            )
        super().__init__(cfg)
        self.max_operand = cfg.max_operand

    def _draw(self, rng, n: int) -> list[Prompt]:
        out = []
        for _ in range(n):
            a, b = rng.randrange(self.max_operand), rng.randrange(self.max_operand)
            out.append(Prompt(f"{a}+{b}=", str(a + b)))
        return out
