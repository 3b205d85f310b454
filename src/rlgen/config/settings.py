"""A run's resolved values, each with where it came from, and how one dotted key of a config is read or set.
The plan fills the values a config leaves null with these; `rlgen plan` lists them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One value of the run and where it came from: "config" (set in a config file or on the command line),
    "recipe <name>" or "derived: <why>"."""

    key: str
    value: Any
    source: str


def get_key(cfg: Any, key: str) -> Any:
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def set_key(cfg: Any, key: str, value: Any) -> Any:
    """A copy of the (frozen or not) dataclass tree cfg with the dotted key set to value."""
    head, _, rest = key.partition(".")
    if not rest:
        return dataclasses.replace(cfg, **{head: value})
    return dataclasses.replace(cfg, **{head: set_key(getattr(cfg, head), rest, value)})
