"""Settings a feature that is off ignores: a key the feature's switch governs, changed from its default while the
switch is off, is refused (the user meant the feature to be on, or set something that does nothing). Presets leave
the keys a switch governs at their defaults, so only the user's own changes are named. Pure: no torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rlgen.config import RunConfig, get_key, plain


@dataclass(frozen=True)
class Switch:
    key: str  # the dotted key that turns the feature on and off
    off: tuple[Any, ...]  # the values that turn it off
    on: str  # how to turn it on, as typed on the command line
    governs: tuple[str, ...] = ()  # the keys it governs; empty: every other key of the switch's group


SWITCHES = (
    Switch("learner.lora.enabled", (False,), "learner.lora.enabled=true"),
    Switch("wandb.mode", ("disabled",), "wandb.mode=offline"),
    Switch("eval.every", (0,), "eval.every=20"),
    Switch("algo.dynamic_sampling", (False,), "algo.dynamic_sampling=true", ("algo.max_gen_batches",)),
    Switch("algo.partial_rollouts", (0,), "algo.partial_rollouts=0.25", ("algo.partial_max_steps",)),
    Switch("algo.kl_coef", (0,), "algo.kl_coef=0.001",
           ("algo.kl_estimator", "algo.kl_bias_correction", "algo.kl_penalty")),
)


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
    """One sentence for each key changed from its default that a switched-off feature ignores (a key that p
    already refuses keeps its one sentence)."""
    defaults = RunConfig()
    named = {sentence.split("=", 1)[0] for sentence in p}
    for switch in SWITCHES:
        state = plain(get_key(cfg, switch.key))
        if state is None or state not in switch.off:
            continue
        for key in governed(switch):
            value = get_key(cfg, key)
            if plain(value) != plain(get_key(defaults, key)) and key not in named:
                p.append(f"{key}={typed(value)} has no effect with {switch.key}={typed(state)}; drop it or set "
                         f"{switch.on}.")


__all__ = ["SWITCHES", "check_ignored", "governed", "typed"]
