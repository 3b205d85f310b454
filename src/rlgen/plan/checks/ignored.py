"""Settings the run would ignore, refused from one table (RULES) of two kinds of rule:

- a Switch: a key the feature's switch governs, changed from its default while the switch is off (the user meant
  the feature to be on, or set something that does nothing);
- a Choice: a key that picks a registered part (algo.advantage, algo.policy_loss) and the settings only some parts
  read (rlgen.algo.registry declares which part reads which): one the chosen part does not read, changed from its
  default.

Presets leave the keys a switch governs at their defaults, so only the user's own changes are named. Pure: no
torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlgen.algo.registry import ADVANTAGE_SETTINGS, LOSS_SETTINGS, part_reads, readers
from rlgen.config import RunConfig, get_key, plain


@dataclass(frozen=True)
class Switch:
    key: str  # the dotted key that turns the feature on and off
    off: tuple[Any, ...]  # the values that turn it off
    on: str  # how to turn it on, as typed on the command line
    governs: tuple[str, ...] = ()  # the keys it governs; empty: every other key of the switch's group

    def ignored(self, cfg: RunConfig, defaults: RunConfig) -> Iterator[tuple[str, str]]:
        """(key, sentence) for each key it governs, changed from its default, while it is off."""
        state = plain(get_key(cfg, self.key))
        if state is None or state not in self.off:
            return
        for key in governed(self):
            value = get_key(cfg, key)
            if plain(value) != plain(get_key(defaults, key)):
                yield key, (f"{key}={typed(value)} has no effect with {self.key}={typed(state)}; drop it or set "
                            f"{self.on}.")


@dataclass(frozen=True)
class Choice:
    key: str  # the dotted key that picks a registered part (rlgen.algo.registry.CHOOSERS)
    settings: tuple[str, ...]  # the settings of the key's group that only some parts read
    what: str  # a part in words: "an advantage estimator"

    def ignored(self, cfg: RunConfig, defaults: RunConfig) -> Iterator[tuple[str, str]]:
        """(key, sentence) for each setting the chosen part does not read, changed from its default."""
        group = self.key.rsplit(".", 1)[0]
        name = str(get_key(cfg, self.key))
        for setting in self.settings:
            key = f"{group}.{setting}"
            value, default = get_key(cfg, key), get_key(defaults, key)
            if part_reads(self.key, name, setting) or plain(value) == plain(default):
                continue
            fix = f"set {key}={typed(default)} (its default)"
            if others := " or ".join(f"{self.key}={n}" for n in readers(self.key, setting)):
                fix += f" or choose {self.what} that reads it: {others}"
            yield key, f"{key}={typed(value)} has no effect with {self.key}={name}, which does not read it; {fix}."


SWITCHES = (
    Switch("learner.lora.enabled", (False,), "learner.lora.enabled=true"),
    Switch("wandb.mode", ("disabled",), "wandb.mode=offline"),
    Switch("eval.every", (0,), "eval.every=20"),
    Switch("algo.dynamic_sampling", (False,), "algo.dynamic_sampling=true", ("algo.max_gen_batches",)),
    Switch("algo.partial_rollouts", (0,), "algo.partial_rollouts=0.25", ("algo.partial_max_steps",)),
    Switch("algo.kl_coef", (0,), "algo.kl_coef=0.001",
           ("algo.kl_estimator", "algo.kl_bias_correction", "algo.kl_penalty")),
)
CHOICES = (
    Choice("algo.advantage", ADVANTAGE_SETTINGS, "an advantage estimator"),
    Choice("algo.policy_loss", LOSS_SETTINGS, "a policy loss"),
)
RULES: tuple[Switch | Choice, ...] = (*SWITCHES, *CHOICES)


def governed(switch: Switch) -> tuple[str, ...]:
    """The keys a switch governs."""
    if switch.governs:
        return switch.governs
    group, name = switch.key.rsplit(".", 1)
    return tuple(f"{group}.{f.name}" for f in dataclasses.fields(get_key(RunConfig(), group)) if f.name != name)


def typed(value: Any) -> str:
    """A value as the command line takes it: true/false, null, [a,b], an enum by its value."""
    value = plain(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(typed(v) for v in value) + "]"
    return str(value)


def check_ignored(cfg: RunConfig, p: list[str]) -> None:
    """One sentence for each key changed from its default that the run would ignore, by RULES (a key that p
    already refuses keeps its one sentence)."""
    defaults = RunConfig()
    named = {sentence.split("=", 1)[0] for sentence in p}
    for rule in RULES:
        for key, sentence in rule.ignored(cfg, defaults):
            if key not in named:
                named.add(key)
                p.append(sentence)


__all__ = ["CHOICES", "RULES", "SWITCHES", "Choice", "Switch", "check_ignored", "governed", "typed"]
