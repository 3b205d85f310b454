"""A run's resolved values, each with where it came from, and how one dotted key of a config is read or set.
The plan fills the values a config leaves null with these; `rlgen plan` lists them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
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


def plain(x: Any) -> Any:
    """A config (or any value in one) as JSON values: dataclasses as dicts, enums as their values."""
    if isinstance(x, Enum):
        return x.value
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x
