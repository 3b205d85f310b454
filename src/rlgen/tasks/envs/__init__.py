"""Environments for multi-turn tasks: the protocol an episode is played against, and their registry.

An environment is any object with

    reset(prompt: Prompt, seed: int) -> None         # a fresh episode for this prompt
    step(action: str) -> Step                       # the policy's turn (decoded) -> the environment's answer

either of which may be ``async def``. ``Step.observation`` is what the environment says back (a tool's result,
a user's turn, a game's state, an error the model can read); it goes into the context and out of the loss.
``Step.reward`` is this turn's reward (the episode's reward is their sum), and ``Step.done`` ends the episode.
An environment class may also draw its own prompts (``draw(rng, n) -> list[Prompt]``) and give transcripts for
the warm start (``demonstrations``); otherwise the prompts come from ``task.path``. Pure Python (no torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rlgen.tasks.base import Prompt, TaskDataError


@dataclass
class Step:
    # what the environment says back: text, or chat messages ({"role", "content"}, e.g. tool results then a user
    # turn); None or empty: nothing (then the episode must end)
    observation: str | list[dict[str, Any]] | None = None
    reward: float = 0.0  # this turn's reward; the episode's is the sum
    done: bool = False
    role: str = "user"  # the chat role the observation is rendered as: "user", or "tool" for a tool's result


@dataclass
class Opening:
    """What reset() may return: the episode's own first messages (and the tools a chat template lists), which
    the engine renders as its prompt instead of the task's (an agent that writes its own conversation)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


@runtime_checkable
class Environment(Protocol):
    def reset(self, prompt: Prompt, seed: int) -> Any: ...

    def step(self, action: str) -> Any: ...


_ENVS: dict[str, Callable[..., Any]] = {}


def register_env(name: str) -> Callable[[type], type]:
    """A class decorator: ``task.env=<name>`` builds the class with ``task.env_args`` as keyword arguments."""

    def add(cls: type) -> type:
        _ENVS[name] = cls
        return cls

    return add


def env_class(name: str) -> Callable[..., Any]:
    """The environment class for ``task.env``: a registered name or ``module:Class``."""
    _load_builtin()
    if name in _ENVS:
        return _ENVS[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise TaskDataError(f"task.env={name!r} cannot be imported ({err}); give module:Class of an "
                                "environment importable here, or a registered name.") from err
    raise TaskDataError(f"task.env={name!r} is not an environment; use one of {', '.join(sorted(_ENVS))} "
                        "or module:Class.")


def make_env(name: str, args: dict[str, Any]) -> Any:
    """An instance of ``task.env`` built with ``task.env_args``; whatever stops it being built is TaskDataError,
    one sentence naming task.env."""
    cls = env_class(name)
    try:
        env = cls(**args)
    except TaskDataError:
        raise
    except TypeError as err:
        raise TaskDataError(f"task.env={name!r} does not take task.env_args={args} ({err}).") from err
    except ValueError as err:
        raise TaskDataError(f"task.env={name!r} refuses task.env_args={args}: {err}") from err
    except Exception as err:  # noqa: BLE001 - an environment's own failure to start, of any kind
        raise TaskDataError(f"task.env={name!r} cannot be built with task.env_args={args}: its constructor raised "
                            f"{type(err).__name__}: {err}; fix what it needs (or its arguments).") from err
    if not isinstance(env, Environment):
        raise TaskDataError(f"task.env={name!r} builds a {type(env).__name__}, which has no reset(prompt, seed) "
                            "and step(action); see docs/environments.md.")
    return env


def env_names() -> list[str]:
    _load_builtin()
    return sorted(_ENVS)


def _load_builtin() -> None:
    from rlgen.tasks.envs import (  # noqa: F401 - they register themselves
        agent,
        chain,
        procedural,
        sandbox,
        tools,
        verifiers_env,
    )


__all__ = ["Environment", "Opening", "Step", "env_class", "env_names", "make_env", "register_env"]
