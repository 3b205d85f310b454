"""The maths by name: two tables, advantage estimators (rewards [N] -> advantages [N], on the driver) and policy
losses (LossInputs -> LossOutputs, on the learner). A preset, conf/algo/<name>.yaml, picks one of each with
algo.advantage and algo.policy_loss plus their settings.

Entries are "module:function" strings, imported only where they run, so the plan checks names without torch.
Each entry also says which of the settings that only some entries read (ADVANTAGE_SETTINGS, LOSS_SETTINGS) it
reads, and an estimator whether it compares the samples of one prompt: the plan refuses a setting the chosen
entry ignores (plan.checks.ignored). register_advantage / register_policy_loss add your own.
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

# algo settings some estimators read and others ignore; every other algo setting is read by every estimator
ADVANTAGE_SETTINGS = ("scale_rewards", "reward_std")
# algo settings some policy losses read and others ignore
LOSS_SETTINGS = ("importance_level", "clip_low", "clip_high")


@dataclass(frozen=True)
class Part:
    """A registered policy loss (or estimator): its function (or "module:function") and which of its table's
    settings (LOSS_SETTINGS or ADVANTAGE_SETTINGS) it reads; None: all of them (none is refused as ignored)."""

    fn: str | Callable[..., Any]
    reads: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Estimator(Part):
    """A registered advantage estimator; groups: it compares the samples of one prompt, so it needs
    algo.samples_per_prompt >= 2."""

    groups: bool = True


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator("rlgen.algo.advantages:grpo_advantages", ADVANTAGE_SETTINGS),
    "rloo": Estimator("rlgen.algo.rloo:rloo_advantages", ()),
    "reinforce_pp": Estimator("rlgen.algo.reinforce_pp:reinforce_pp_advantages", (), groups=False),
    "reinforce_pp_baseline": Estimator("rlgen.algo.reinforce_pp:reinforce_pp_baseline_advantages", ()),
}

POLICY_LOSSES: dict[str, Part] = {
    "ppo_clip": Part("rlgen.algo.ppo_clip:ppo_clip_loss", LOSS_SETTINGS),
    "cispo": Part("rlgen.algo.cispo:cispo_loss", ("clip_low", "clip_high")),  # its ratio is per token
}


# (the key that picks a part, its table, the settings only some of its parts read)
CHOOSERS = (("algo.advantage", ADVANTAGE_ESTIMATORS, ADVANTAGE_SETTINGS),
            ("algo.policy_loss", POLICY_LOSSES, LOSS_SETTINGS))


class UnknownAlgorithm(LookupError):
    """algo.advantage or algo.policy_loss names nothing registered."""


def register_advantage(name: str, fn: str | Advantages, *, reads: tuple[str, ...] | None = None,
                       groups: bool = True) -> None:
    """Make ``algo.advantage=<name>`` choose fn, in this process. reads: which of ADVANTAGE_SETTINGS it reads
    (None: all); groups: it compares the samples of one prompt (algo.samples_per_prompt >= 2)."""
    ADVANTAGE_ESTIMATORS[name] = Estimator(fn, reads, groups)


def register_policy_loss(name: str, fn: str | Loss, *, reads: tuple[str, ...] | None = None) -> None:
    """Make ``algo.policy_loss=<name>`` choose fn, in this process. reads: which of LOSS_SETTINGS it reads
    (None: all)."""
    POLICY_LOSSES[name] = Part(fn, reads)


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


def part_reads(key: str, name: str, setting: str) -> bool:
    """Whether the part `name` that `key` (algo.advantage or algo.policy_loss) picks reads algo.<setting>: True for
    a setting every part reads, and for a name that is not registered (algorithm_problems says so)."""
    table, settings = next((t, s) for k, t, s in CHOOSERS if k == key)
    part = table.get(str(name))
    return part is None or part.reads is None or setting not in settings or setting in part.reads


def readers(key: str, setting: str) -> list[str]:
    """The registered parts `key` can pick that read algo.<setting>, by name."""
    table = next(t for k, t, _ in CHOOSERS if k == key)
    return sorted(name for name in table if part_reads(key, name, setting))


def compares_groups(advantage: str) -> bool:
    """Whether the estimator compares the samples of one prompt (needs algo.samples_per_prompt >= 2); True for a
    name that is not registered."""
    part = ADVANTAGE_ESTIMATORS.get(str(advantage))
    return part is None or part.groups


def _resolve(table: dict[str, Any], key: str, name: str) -> Callable[..., Any]:
    if name not in table:
        raise UnknownAlgorithm(f"algo.{key}={name} is not registered; choose one of: {', '.join(sorted(table))}.")
    found = table[name].fn
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


__all__ = ["ADVANTAGE_ESTIMATORS", "ADVANTAGE_SETTINGS", "CHOOSERS", "LOSS_SETTINGS", "POLICY_LOSSES", "Algorithm",
           "Estimator", "Part", "UnknownAlgorithm", "advantage_estimator", "algorithm", "algorithm_problems",
           "compares_groups", "configured_advantages", "configured_loss", "part_reads", "policy_loss", "readers",
           "register_advantage", "register_policy_loss", "unregister_advantage", "unregister_policy_loss"]
