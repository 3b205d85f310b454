"""What every task provides: prompts for RL, demonstrations for the warm start, and a reward. Pure Python."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Prompt:
    text: str
    answer: str
    source: str = field(default="", compare=False)  # where it came from, for messages: "rows.jsonl:7"


class TaskDataError(ValueError):
    """A task's data or settings cannot be used; the message says where and how to fix it."""


@runtime_checkable
class Task(Protocol):
    name: str

    def prompts(self, step: int, n: int) -> list[Prompt]:
        """n prompts for an RL step; the same (task seed, step) always gives the same list."""
        ...

    def extra_prompts(self, step: int, round: int, n: int) -> list[Prompt]:
        """n more prompts for an RL step, for its generation round `round` >= 1 (dynamic sampling refills the
        batch with them); the same (task seed, step, round) always gives the same list."""
        ...

    def demonstrations(self, n: int, seed: int) -> list[Prompt]:
        """n prompts with their answers for supervised warm start."""
        ...

    def reward(self, completion: str, prompt: Prompt) -> float:
        """Score of a decoded completion (special tokens skipped): the weighted sum of the task's rewards."""
        ...

    def score(self, completion: str, prompt: Prompt) -> tuple[float, dict[str, float]]:
        """The reward and each of its parts (reward name -> value in [0, 1])."""
        ...

    def eval_prompts(self) -> list[Prompt]:
        """Held-out prompts for evaluation (never drawn for training); [] when the task has none."""
        ...


def step_rng(seed: int | str, stream: str, step: int) -> random.Random:
    """A generator private to (task seed, stream, step), independent of any global random state."""
    return random.Random(f"{seed}/{stream}/{step}")


EVAL_PROMPTS_SYNTHETIC = 64  # held-out prompts a synthetic task draws from its own "eval" stream


class BaseTask:
    """What tasks share: the seed, the reward set, and reward()/score() over it."""

    name = "task"

    def __init__(self, cfg) -> None:
        from rlgen.tasks.rewards import RewardSet

        self.seed = cfg.seed
        self.rewards = RewardSet.from_config(cfg)

    def reward(self, completion: str, prompt: Prompt) -> float:
        return self.rewards.score(completion, prompt.answer)[0]

    def score(self, completion: str, prompt: Prompt) -> tuple[float, dict[str, float]]:
        return self.rewards.score(completion, prompt.answer)

    def eval_prompts(self) -> list[Prompt]:
        return []


class DrawnTask(BaseTask):
    """A synthetic task: every prompt list is drawn by ``_draw(rng, n)`` from a generator of its own stream
    (prompts per step, extra rounds, demonstrations, held-out eval), so (seed, stream, step) fixes it."""

    def _draw(self, rng: random.Random, n: int) -> list[Prompt]:
        raise NotImplementedError

    def prompts(self, step: int, n: int) -> list[Prompt]:
        return self._draw(step_rng(self.seed, "prompts", step), n)

    def extra_prompts(self, step: int, round: int, n: int) -> list[Prompt]:
        return self._draw(step_rng(self.seed, f"extra/{round}", step), n)

    def demonstrations(self, n: int, seed: int) -> list[Prompt]:
        return self._draw(step_rng(seed, "demos", 0), n)

    def eval_prompts(self) -> list[Prompt]:
        return self._draw(step_rng(self.seed, "eval", 0), EVAL_PROMPTS_SYNTHETIC)


class RowTask(BaseTask):
    """A task over a fixed list of rows: step s takes rows s*n .. s*n+n-1 of an endless sequence of seeded
    shuffles of them (one shuffle per epoch), so (seed, step) always gives the same prompts."""

    rows: list[Prompt]
    held_out: list[Prompt]

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self._orders: dict[tuple[int, int], list[int]] = {}

    def _order(self, seed: int | str, epoch: int) -> list[int]:
        key = (seed, epoch)
        if key not in self._orders:
            order = list(range(len(self.rows)))
            step_rng(seed, "epoch", epoch).shuffle(order)
            if len(self._orders) >= 4:
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = order
        return self._orders[key]

    def _take(self, seed: int | str, start: int, n: int) -> list[Prompt]:
        out: list[Prompt] = []
        index = start
        while len(out) < n:
            epoch, pos = divmod(index, len(self.rows))
            chunk = self._order(seed, epoch)[pos : pos + n - len(out)]
            out.extend(self.rows[i] for i in chunk)
            index += len(chunk)
        return out

    def prompts(self, step: int, n: int) -> list[Prompt]:
        return self._take(self.seed, step * n, n)

    def extra_prompts(self, step: int, round: int, n: int) -> list[Prompt]:
        return self._take(f"{self.seed}/extra/{round}", step * n, n)  # a shuffle of its own per round

    def demonstrations(self, n: int, seed: int) -> list[Prompt]:
        return self._take(seed, 0, n)

    def eval_prompts(self) -> list[Prompt]:
        return list(self.held_out)

    def keep_rows(self, keep) -> int:
        """Leave out the rows keep(row) refuses (prompts over task.max_prompt_tokens with long_prompts=skip);
        returns how many went. Cursors start again over the rows that stay."""
        before = len(self.rows)
        self.rows = [r for r in self.rows if keep(r)]
        self.held_out = [r for r in self.held_out if keep(r)]
        self._orders.clear()
        if not self.rows:
            raise TaskDataError(f"all {before} rows of the task are over task.max_prompt_tokens; raise it.")
        return before - len(self.rows)


def split_held_out(rows: list[Prompt], fraction: float, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """(training rows, held-out rows): a seeded fraction of rows set aside for evaluation."""
    if fraction <= 0:
        return rows, []
    order = list(range(len(rows)))
    step_rng(seed, "held-out", 0).shuffle(order)
    k = max(1, round(len(rows) * fraction))
    held = set(order[:k])
    return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)]
