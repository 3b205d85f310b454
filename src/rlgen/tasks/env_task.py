"""``task.kind=env``: a multi-turn task. Its prompts are drawn by the environment class (``draw``) or read from
``task.path`` (one ``{"prompt", "answer"}`` row per line); each sample of a prompt is an episode played against
``task.env`` (rlgen.tasks.envs) inside the engine, and the environment's reward is the sample's."""

from __future__ import annotations

from typing import Any

from rlgen.tasks.base import DrawnTask, Prompt, TaskDataError, step_rng
from rlgen.tasks.envs import make_env


def episode_problems(cfg: Any) -> list[str]:
    """What the task config (TaskConfig) lacks for episodes to be played, one sentence each: the plan's value
    checks and the task itself say the same words, so a problem is listed once."""
    p = []
    if not cfg.env:
        p.append("task.kind=env needs task.env=<a registered environment or module:Class>; see docs/environments.md.")
    if cfg.max_turns < 1:
        p.append(f"task.max_turns={cfg.max_turns} must be at least 1 (the policy's turns per episode).")
    return p


class EnvTask(DrawnTask):
    name = "env"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        if problems := episode_problems(cfg):
            raise TaskDataError(problems[0])
        self.name, self.env_name = f"env:{cfg.env}", cfg.env
        self.env = make_env(cfg.env, dict(cfg.env_args))  # the driver's own: prompts and demonstrations
        self._rows: list[Prompt] | None = None
        if cfg.path:
            from rlgen.tasks.jsonl import load_rows

            self._rows = load_rows(cfg.path)
        elif not callable(getattr(self.env, "draw", None)):
            raise TaskDataError(f"task.env={cfg.env!r} draws no prompts of its own (no draw(rng, n)); give "
                                "task.path=<rows.jsonl> with {\"prompt\", \"answer\"} rows.")

    def _draw(self, rng, n: int) -> list[Prompt]:
        if self._rows is not None:
            return [self._rows[rng.randrange(len(self._rows))] for _ in range(n)]
        return self._drawn("draw", self.env.draw, rng, n)

    def _drawn(self, method: str, fn: Any, rng: Any, n: int) -> list[Prompt]:
        """fn(rng, n), the environment's own prompts (or transcripts); whatever goes wrong there is TaskDataError,
        one sentence naming task.env."""
        try:
            out = fn(rng, n)
        except Exception as err:  # noqa: BLE001 - an environment's own failure, of any kind
            raise TaskDataError(f"task.env={self.env_name!r}: its {method}(rng, n) raised {type(err).__name__}: "
                                f"{err}; fix it, or give task.path=<rows.jsonl> with {{\"prompt\", \"answer\"}} "
                                "rows.") from err
        items = list(out) if isinstance(out, (list, tuple)) else [out]
        bad = [p for p in items if not isinstance(p, Prompt)]
        what = f"a {type(bad[0]).__name__}" if bad else \
            f"{len(items)} prompts" if method == "draw" and len(items) != n else ""
        if what:
            raise TaskDataError(f"task.env={self.env_name!r}: its {method}(rng, {n}) returned {what}; it must return "
                                f"a list of {n} rlgen.tasks.base.Prompt.")
        return items

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The environment's tools as function schemas (a chat template lists them in the prompt), or None."""
        schemas = getattr(self.env, "schemas", None)
        return schemas() if callable(schemas) else None

    def demonstrations(self, n: int, seed: int) -> list[Prompt]:
        demos = getattr(self.env, "demonstrations", None)
        if callable(demos):
            return self._drawn("demonstrations", demos, step_rng(seed, "demos", 0), n)
        return super().demonstrations(n, seed)
