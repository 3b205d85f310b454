"""The maths by name: two tables, advantage estimators (rewards [N] -> advantages [N], on the driver) and policy
losses (LossInputs -> LossOutputs, on the learner). A preset, conf/algo/<name>.yaml, picks one of each with
algo.advantage and algo.policy_loss plus their settings.

Entries are "module:function" strings, imported only where they run, so the plan checks names without torch.
register_advantage / register_policy_loss add your own (a function or a "module:function" string).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlgen.config.compose import group_options

# advantages(rewards [N], group_ids [N], algo: AlgoConfig) -> advantages [N] float32
Advantages = Callable[..., Any]
# loss(inputs: rlgen.algo.inputs.LossInputs, algo: AlgoConfig) -> rlgen.algo.inputs.LossOutputs
Loss = Callable[..., Any]

ADVANTAGE_ESTIMATORS: dict[str, str | Advantages] = {
    "grpo": "rlgen.algo.advantages:grpo_advantages",
    "rloo": "rlgen.algo.rloo:rloo_advantages",
    "reinforce_pp": "rlgen.algo.reinforce_pp:reinforce_pp_advantages",
    "reinforce_pp_baseline": "rlgen.algo.reinforce_pp:reinforce_pp_baseline_advantages",
}

POLICY_LOSSES: dict[str, str | Loss] = {
    "ppo_clip": "rlgen.algo.ppo_clip:ppo_clip_loss",
    "cispo": "rlgen.algo.cispo:cispo_loss",
}


class UnknownAlgorithm(LookupError):
    """algo.advantage or algo.policy_loss names nothing registered."""


def register_advantage(name: str, fn: str | Advantages) -> None:
    """Make ``algo.advantage=<name>`` choose fn, in this process."""
    ADVANTAGE_ESTIMATORS[name] = fn


def register_policy_loss(name: str, fn: str | Loss) -> None:
    """Make ``algo.policy_loss=<name>`` choose fn, in this process."""
    POLICY_LOSSES[name] = fn


def unregister_advantage(name: str) -> None:
    ADVANTAGE_ESTIMATORS.pop(name, None)


def unregister_policy_loss(name: str) -> None:
    POLICY_LOSSES.pop(name, None)


_TABLES = (("advantage", "an advantage estimator", ADVANTAGE_ESTIMATORS, "register_advantage"),
           ("policy_loss", "a policy loss", POLICY_LOSSES, "register_policy_loss"))


def algorithm_problems(algo: Any) -> list[str]:
    """One sentence, with the choices, for algo.kind when it names no preset and for each of algo.advantage and
    algo.policy_loss that names nothing registered. Imports nothing heavy."""

    problems = []
    presets = group_options("algo")
    if str(algo.kind) not in presets:
        problems.append(f"algo.kind={algo.kind} is not an algorithm preset; choose one of: {', '.join(presets)} "
                        "(pick one with algo=<name>; algo.advantage and algo.policy_loss choose the maths).")
    for key, what, table, register in _TABLES:
        name = str(getattr(algo, key))
        if name not in table:
            problems.append(f"algo.{key}={name} is not {what}; choose one of: {', '.join(sorted(table))} (or add "
                            f"yours with rlgen.algo.registry.{register}).")
    return problems


def _resolve(table: dict[str, Any], key: str, name: str) -> Callable[..., Any]:
    if name not in table:
        raise UnknownAlgorithm(f"algo.{key}={name} is not registered; choose one of: {', '.join(sorted(table))}.")
    found = table[name]
    if isinstance(found, str):
        module, _, attr = found.partition(":")
        found = getattr(importlib.import_module(module), attr)
    return found


def advantage_estimator(name: str) -> Advantages:
    """The registered advantage estimator (imports its module, and so torch)."""
    return _resolve(ADVANTAGE_ESTIMATORS, "advantage", str(name))


def policy_loss(name: str) -> Loss:
    """The registered policy loss (imports its module, and so torch)."""
    return _resolve(POLICY_LOSSES, "policy_loss", str(name))


def configured_advantages(rewards: Any, group_ids: Any, algo: Any) -> Any:
    """The advantages of the estimator algo.advantage names."""
    return advantage_estimator(algo.advantage)(rewards, group_ids, algo)


def configured_loss(inputs: Any, algo: Any) -> Any:
    """The loss algo.policy_loss names."""
    return policy_loss(algo.policy_loss)(inputs, algo)


@dataclass(frozen=True)
class Algorithm:
    """What the driver and the learners call: kind is the preset's name (a label); the functions look up the
    AlgoConfig they are given, so a run's overrides of algo.advantage and algo.policy_loss take effect."""

    kind: str
    advantages: Advantages = configured_advantages
    loss: Loss = configured_loss


def algorithm(algo: Any) -> Algorithm:
    """A run's algorithm. Given the AlgoConfig: its estimator and loss, resolved here (so a function registered in
    this process travels with the Algorithm to actors). Given only the preset's name: functions that look up the
    AlgoConfig each call receives, in the process that calls them."""
    if isinstance(algo, str):
        return Algorithm(algo)
    return Algorithm(str(algo.kind), advantage_estimator(algo.advantage), policy_loss(algo.policy_loss))


__all__ = ["ADVANTAGE_ESTIMATORS", "POLICY_LOSSES", "Algorithm", "UnknownAlgorithm", "advantage_estimator",
           "algorithm", "algorithm_problems", "configured_advantages", "configured_loss", "policy_loss",
           "register_advantage", "register_policy_loss", "unregister_advantage", "unregister_policy_loss"]
