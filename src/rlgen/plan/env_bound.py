"""How long a step's environment calls may take on one engine at the worst: each call may run to
task.env_timeout_s, an episode makes up to task.max_turns + 1 calls (its reset, then a step after each turn), and
an engine's episodes make their calls task.env_workers at a time. The run's timeout sentences and the plan's note
say it with the numbers. Pure arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

from rlgen.config import RunConfig, TaskKind


@dataclass(frozen=True)
class EnvBound:
    env_timeout_s: float
    max_turns: int
    episodes: int  # the most episodes one engine plays in a step
    env_workers: int

    @property
    def calls(self) -> int:
        """Environment calls per episode at most: its reset and one step per turn."""
        return self.max_turns + 1

    @property
    def rounds(self) -> int:
        """How many times over an engine's episodes fill its task.env_workers for each call."""
        return -(-self.episodes // max(1, self.env_workers))

    @property
    def seconds(self) -> float:
        return self.env_timeout_s * self.calls * self.rounds

    def words(self) -> str:
        """The bound's arithmetic, each factor with the setting behind it."""
        return (f"task.env_timeout_s={self.env_timeout_s:g} s a call x {self.calls} calls an episode (task.max_turns="
                f"{self.max_turns} + 1) x {self.rounds} (the {self.episodes} episodes an engine plays, "
                f"task.env_workers={self.env_workers} at a time) = {self.seconds:.0f} s")


def env_bound(cfg: RunConfig, engines: int) -> EnvBound | None:
    """A multi-turn run's bound, its prompts' groups spread round-robin over ``engines``; None for one without
    episodes."""
    t, a = cfg.task, cfg.algo
    if t.kind != TaskKind.env or engines < 1:
        return None
    episodes = -(-a.prompts_per_step // engines) * a.samples_per_prompt
    return EnvBound(t.env_timeout_s, t.max_turns, episodes, t.env_workers)


def env_time_notes(cfg: RunConfig, engines: int) -> list[str]:
    """A note where one episode whose every environment call takes up to task.env_timeout_s takes longer than
    timeout_s: then a single slow environment stops the run. (A step's bound, every episode's calls that slow, is
    above timeout_s for every preset's defaults; the timeout sentence says it when a step runs past.)"""
    bound = env_bound(cfg, engines)
    if bound is None:
        return []
    one = bound.env_timeout_s * bound.calls
    if one < cfg.timeout_s:
        return []
    return [f"task.env_timeout_s={bound.env_timeout_s:g} s a call x {bound.calls} calls an episode (task.max_turns="
            f"{bound.max_turns} + 1) = {one:.0f} s is not below timeout_s={cfg.timeout_s:g}, so one episode whose "
            f"environment answers each call just within task.env_timeout_s stops the run (a step's calls may take up "
            f"to {bound.words()}); lower "
            f"task.env_timeout_s, or raise timeout_s above {one:.0f}."]


__all__ = ["EnvBound", "env_bound", "env_time_notes"]
