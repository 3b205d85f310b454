"""``verifiers``: an environment of the ``verifiers`` library, by id, run unchanged (``task=verifiers
task.env_args.env=<id>``, and its ``load_environment`` keyword arguments in ``task.env_args.args``).

The environment is loaded with verifiers' own ``load_environment`` (the id is an installed module that exposes
one) and plays each episode as it would against any model: its ``run_rollout`` talks to an OpenAI client whose
every call is one turn of the policy's (the ``agent`` environment's client), then its rubric scores the rollout
and that score is the episode's reward. Prompts are the rows of the environment's dataset. Its
``MultiTurnEnv``, ``ToolEnv`` (OpenAI tool calls) and single-turn environments all talk to the model this way.
Needs the ``verifiers`` extra (``pip install 'rlgen[verifiers]'``: verifiers' 0.3 line, whose classic classes
these are)."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import signal
import threading
from collections.abc import Iterator
from typing import Any

from rlgen.tasks.base import Prompt, TaskDataError
from rlgen.tasks.envs import register_env
from rlgen.tasks.envs.agent import AgentEnv

_LOADED: dict[str, Any] = {}
_LOCK = threading.Lock()


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """verifiers' Environment sets SIGINT and SIGTERM handlers when it is built (its teardown, then exit 143). The
    run keeps its own (a SIGTERM stops it with a checkpoint), and in a worker thread setting one would raise, so
    while an environment loads, setting a handler does nothing."""
    real = signal.signal
    signal.signal = lambda signum, handler: signal.getsignal(signum)  # type: ignore[assignment]
    try:
        yield
    finally:
        signal.signal = real


@contextlib.contextmanager
def _own_errors_only(loader: Any) -> Iterator[None]:
    """verifiers' load_environment logs its failure (its logger is its module's name) before it raises; the error
    it raises says the same, and rlgen's sentence carries it and its cause, so while it loads that logger is quiet
    below CRITICAL."""
    logger = logging.getLogger(getattr(loader, "__module__", "verifiers"))
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _why(err: BaseException) -> str:
    """An error in words, with its cause when it has one (the module that could not be imported)."""
    cause = err.__cause__
    said = f"{type(err).__name__}: {str(err).rstrip('.')}"
    return said + (f"; {type(cause).__name__}: {str(cause).rstrip('.')}" if cause else "")


def _load(env: str, args: dict[str, Any]) -> Any:
    """The environment and its dataset, loaded once per process for the same id and arguments."""
    key = json.dumps([env, args], sort_keys=True, default=str)
    with _LOCK:
        if key not in _LOADED:
            try:
                import verifiers as vf
            except ImportError as err:
                raise TaskDataError("task.env=verifiers needs the verifiers package: "
                                    "pip install 'rlgen[verifiers]'.") from err
            if not env:
                raise TaskDataError("task.env=verifiers needs task.env_args.env=<an installed verifiers "
                                    "environment's id>.")
            try:
                with _signals_kept(), _own_errors_only(vf.load_environment):
                    loaded = vf.load_environment(env, **args)
            except (ImportError, AttributeError, TypeError, ValueError, RuntimeError) as err:
                raise TaskDataError(f"verifiers cannot load environment {env!r} with task.env_args.args={args} "
                                    f"({_why(err)}); install its package, or fix the arguments.") from err
            dataset = loaded.get_dataset()
            if dataset is None or len(dataset) == 0:
                raise TaskDataError(f"verifiers environment {env!r} has no dataset rows to draw prompts from.")
            _LOADED[key] = (loaded, dataset)
        return _LOADED[key]


def _text(prompt: Any) -> str:
    """A row's prompt as text (its messages' contents, one after another), for the task's checks and logs."""
    if isinstance(prompt, str):
        return prompt
    return "".join(str(m.get("content") or "") for m in prompt if isinstance(m, dict))


@register_env("verifiers")
class VerifiersEnv(AgentEnv):
    def __init__(self, env: str = "", args: dict[str, Any] | None = None):
        self.id = str(env or "")
        self.env, self.rows = _load(self.id, dict(args or {}))
        super().__init__(self._rollout)

    def draw(self, rng: random.Random, n: int) -> list[Prompt]:
        out = []
        for _ in range(n):
            i = rng.randrange(len(self.rows))
            row = self.rows[i]
            out.append(Prompt(_text(row["prompt"]), str(row.get("answer") or ""), source=f"{self.id}:{i}"))
        return out

    async def _rollout(self, client: Any, prompt: Prompt) -> float:
        """One rollout of the verifiers environment against the episode's client; its rubric's reward."""
        from verifiers.clients import OpenAIChatCompletionsClient

        index = prompt.source.rpartition(":")[2]
        if not index.isdigit():
            raise ValueError(f"the prompt {prompt.source!r} was not drawn from verifiers environment {self.id!r}")
        row = self.rows[int(index)]
        rollout = {k: row[k] for k in ("prompt", "example_id", "answer", "info", "task") if k in row}
        rollout.setdefault("example_id", int(index))
        out = await self.env.run_rollout(rollout, OpenAIChatCompletionsClient(client), self.model, {})
        if out.get("error"):
            raise RuntimeError(f"the verifiers rollout failed: {out['error']}")
        return float(out["reward"])
