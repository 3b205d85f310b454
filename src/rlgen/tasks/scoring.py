"""Rewards for a step's completions, in the driver or in a pool of worker processes (task.reward_workers).

With workers, a step's completions are scored in parallel, and the loop hands a flight to the pool
as soon as its rollouts are in, so a slow checker works while the learner trains. A call that has not come
back within task.reward_timeout_s (per call, spread over the workers) scores 0 and is counted; the pool is
then replaced, since its worker may be stuck. math-verify also bounds its own parses and comparisons.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from rlgen.tasks.rewards import RewardCallError, RewardSet, RewardValueError

log = logging.getLogger(__name__)
_REWARDS: RewardSet | None = None  # a worker's own reward set


class RewardError(RuntimeError):
    """A reward function raised, or returned something that is not a number."""


def _init_worker(task_cfg: Any) -> None:
    global _REWARDS
    _REWARDS = RewardSet.from_config(task_cfg)


def _score_in_worker(text: str, answer: str) -> tuple:
    try:
        total, parts = _REWARDS.score(text, answer)  # type: ignore[union-attr]
        return ("ok", total, parts)
    except RewardCallError as err:
        return ("error", err.name, _what(err.cause), traceback.format_exc())


def _what(err: BaseException) -> str:
    return str(err) if isinstance(err, RewardValueError) else f"raised {type(err).__name__}: {err}"


@dataclass
class Scores:
    totals: list[float]
    parts: dict[str, list[float]]
    timeouts: int = 0

    @property
    def nan_count(self) -> int:
        """Completions whose reward is NaN (a reward function returned NaN)."""
        return sum(1 for t in self.totals if math.isnan(t))

    def means(self) -> dict[str, float]:
        """reward/<name> means over the finite values, reward/timeouts and reward/nan (the NaN rewards), for the
        step's record (one reward: no reward/<name>)."""
        out: dict[str, float] = {"reward/timeouts": float(self.timeouts), "reward/nan": float(self.nan_count)}
        if len(self.parts) > 1:
            out.update({f"reward/{k}": finite_mean(v) for k, v in self.parts.items()})
        return out

    def __add__(self, other: Scores) -> Scores:
        """Two scorings as one (another generation round of the same step)."""
        return Scores(self.totals + other.totals, {k: v + other.parts.get(k, []) for k, v in self.parts.items()},
                      self.timeouts + other.timeouts)


def finite_mean(values: list[float]) -> float:
    """The mean of the finite values (0.0 when there are none)."""
    kept = [v for v in values if math.isfinite(v)]
    return sum(kept) / len(kept) if kept else 0.0


@dataclass
class Pending:
    texts: list[str]
    answers: list[str]
    where: list[str]  # row and prompt, for messages
    step: int
    started: float = field(default_factory=time.time)
    handles: list[Any] | None = None  # pool results; None: scored already
    done: Scores | None = None


class Scorer:
    def __init__(self, rewards: RewardSet, task_cfg: Any, reward_name: str):
        self.rewards, self.cfg, self.name = rewards, task_cfg, reward_name
        self.workers = int(task_cfg.reward_workers)
        self.timeout_s = float(task_cfg.reward_timeout_s)
        self.pool = self._new_pool() if self.workers > 0 else None

    def _new_pool(self) -> Any:
        return multiprocessing.get_context("spawn").Pool(self.workers, initializer=_init_worker, initargs=(self.cfg,))

    def submit(self, texts: list[str], answers: list[str], where: list[str], step: int) -> Pending:
        pending = Pending(texts, answers, where, step)
        if self.pool is None:
            pending.done = self._score_here(pending)
        else:
            pending.handles = [self.pool.apply_async(_score_in_worker, (t, a)) for t, a in zip(texts, answers)]
        return pending

    def given(self, rewards: list[float], where: list[str], step: int) -> Pending:
        """Rewards that came with the completions (a multi-turn episode's, from its environment), as a scoring."""
        first = self.rewards.names[0]
        pending = Pending([""] * len(rewards), [""] * len(rewards), where, step)
        pending.done = Scores([float(r) for r in rewards], {first: [float(r) for r in rewards]})
        return pending

    def result(self, pending: Pending) -> Scores:
        if pending.done is not None:
            return pending.done
        n = len(pending.texts)
        deadline = pending.started + self.timeout_s * math.ceil(n / self.workers) + 5.0
        totals, parts, timeouts = [], {name: [] for name in self.rewards.names}, 0
        for i, handle in enumerate(pending.handles or []):
            try:
                out = handle.get(timeout=max(0.0, deadline - time.time()))
            except multiprocessing.TimeoutError:
                out = ("timeout",)
            if out[0] == "error":
                _, name, what, tb = out
                log.info("reward %s failed in a worker:\n%s", name, tb)
                raise RewardError(self._message(name, what, pending, i))
            if out[0] == "timeout":
                timeouts += 1
                values = dict.fromkeys(self.rewards.names, 0.0)
                total = 0.0
            else:
                _, total, values = out
            totals.append(float(total))
            for name in self.rewards.names:
                parts[name].append(values[name])
        if timeouts:
            log.info("%d reward calls of step %d took longer than task.reward_timeout_s=%g and scored 0",
                     timeouts, pending.step, self.timeout_s)
            self.pool.terminate()  # a stuck worker would hold the next step up
            self.pool = self._new_pool()
        pending.done = Scores(totals, parts, timeouts)
        return pending.done

    def _score_here(self, pending: Pending) -> Scores:
        totals, parts = [], {name: [] for name in self.rewards.names}
        for i, (text, answer) in enumerate(zip(pending.texts, pending.answers)):
            try:
                total, values = self.rewards.score(text, answer)
            except RewardCallError as err:
                raise RewardError(self._message(err.name, _what(err.cause), pending, i)) from err.cause
            totals.append(float(total))
            for name in self.rewards.names:
                parts[name].append(values[name])
        return Scores(totals, parts)

    def _message(self, name: str, what: str, pending: Pending, i: int) -> str:
        label = f"task.reward={name}" if not self.cfg.rewards else f"task.rewards.{name}"
        return (f"{label} {what} at step {pending.step}, on {pending.where[i]} with the completion "
                f"{pending.texts[i][:40]!r}; it must return a number for any string.")

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool = None
