"""Compose a RunConfig from the packaged config tree and Hydra-style overrides (no Hydra app, no run dir)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from rlgen.config import RunConfig, register_configs, to_run_config
from rlgen.config.cards import CARDS, CARDS_GROUP, card_advice, unknown_card
from rlgen.errors import UserError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


class ConfigError(UserError, ValueError):
    """An override or YAML value that does not fit the schema."""


def _compose(overrides: list[str], with_hydra: bool) -> Any:
    """The packaged tree composed with overrides (a DictConfig), with Hydra's own node where with_hydra."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=with_hydra)


def run_dir_template(overrides: list[str]) -> str:
    """hydra.run.dir for these overrides (Hydra's and rlgen's), its interpolations left as written; the overrides
    must compose (compose_run_config has checked them)."""
    from omegaconf import OmegaConf

    return str(OmegaConf.to_container(_compose(overrides, with_hydra=True).hydra.run, resolve=False)["dir"])


def sweep_dir_template(overrides: list[str]) -> tuple[str, str]:
    """hydra.sweep.dir and hydra.sweep.subdir for these overrides, their interpolations left as written."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(_compose(overrides, with_hydra=True).hydra.sweep, resolve=False)
    return str(node["dir"]), str(node["subdir"])


def compose_run_config(overrides: list[str] | tuple[str, ...] = (), hydra_overrides: list[str] | tuple[str, ...] = ()
                       ) -> RunConfig:
    """The RunConfig for overrides; hydra_overrides (hydra.run.dir=... and the like) are checked too, then
    left to Hydra. Every error becomes ConfigError with one sentence."""
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = _compose([*overrides, *hydra_overrides], with_hydra=bool(hydra_overrides))
        if hydra_overrides:
            with open_dict(cfg):
                del cfg["hydra"]
        return to_run_config(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(explain_config_error(err, [*overrides])) from err
    except ValueError as err:
        if "Config group override must be" not in str(err):
            raise
        groups = ("engine", "algo", "hardware", "model", "task")
        bad = next((o for o in overrides if o.lstrip("+~").split("=", 1)[0] in groups), None)
        if bad is None:
            raise ConfigError(f"a config group takes the name of a file in conf/<group>/ ({err}).") from err
        group = bad.lstrip("+~").split("=", 1)[0]
        raise ConfigError(
            f"{bad.lstrip('+~')} is not in conf/{group}/; choose one of: {', '.join(group_options(group))}."
        ) from err


def _known_keys(dotted: str) -> list[str] | None:
    """The schema's field names at the parent of a dotted key, or None if the parent is unknown."""

    node: type | None = RunConfig
    for part in dotted.split(".")[:-1]:
        fields = {f.name: f for f in dataclasses.fields(node)} if node and dataclasses.is_dataclass(node) else {}
        f = fields.get(part)
        node = f.default_factory if f is not None and callable(f.default_factory) else None  # type: ignore[misc]
        if node is None:
            return None
    return sorted(f.name for f in dataclasses.fields(node)) if node and dataclasses.is_dataclass(node) else None


def _is_map(dotted: str) -> bool:
    """Whether a dotted key of the schema is a dict field (a free-form map such as engine.env)."""

    node: type | None = RunConfig
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(node)} if node and dataclasses.is_dataclass(node) else {}
        f = fields.get(part)
        if f is None:
            return False
        if i == len(parts) - 1:
            return str(f.type).startswith("dict")
        node = f.default_factory if callable(f.default_factory) else None  # type: ignore[misc]
    return False


# keys of earlier releases, and what took their place
RENAMED = {
    "algo.micro_batch_size": "algo.micro_batch_tokens, a budget of real tokens a learner micro-batch packs (rows "
                             "no longer pad to the longest); leave it unset for the most that fits the GPU",
}


def _not_a_setting(key: str) -> str:
    if key in RENAMED:
        return f"{key} is gone; use {RENAMED[key]}."
    known = _known_keys(key)
    where = key.rsplit(".", 1)[0] if "." in key else "the top level"
    hint = f"; known keys there: {', '.join(known)}" if known else "; `rlgen train --cfg job` prints every key"
    return f"{key} is not a setting of {where} (misspelled?){hint}."


def group_options(group: str) -> list[str]:
    """The presets of a config group: the YAML files in conf/<group>/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def made_without_gpus(preset: str) -> bool:
    """Whether a hardware preset of conf/hardware/ is made for a machine without GPUs (its gpus_per_node: 0;
    hardware=auto gives none and reads this machine's)."""
    from omegaconf import OmegaConf

    path = CONF_DIR / "hardware" / f"{preset}.yaml"
    return path.is_file() and OmegaConf.load(path).get("gpus_per_node") == 0


def _chosen(group: str, overrides: list[str]) -> str:
    """The preset of a config group these overrides choose: the last one given, else conf/config.yaml's."""
    given = [o.split("=", 1)[1] for o in overrides if o.lstrip("+~").startswith(f"{group}=")]
    if given:
        return given[-1]
    from omegaconf import OmegaConf

    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))["defaults"]
    return next((str(d[group]) for d in defaults if isinstance(d, dict) and group in d), "")


def _card_error(msg: str, overrides: list[str]) -> str | None:
    """The sentence for a GPU card key that is not in the card table (named by a preset or by an override of
    hardware/gpu), or for an override of hardware/gpu on a preset that names no card; None for other errors."""
    m = re.search(rf"In '([^']+)': Could not find '{CARDS_GROUP}/([^']+)'", msg)
    if m:
        preset, key = m.groups()
        given = f"{CARDS_GROUP}={key}"
        return unknown_card(key, f"{given}: " if any(o.lstrip("+") == given for o in overrides) else
                            f"conf/{preset}.yaml: ")
    if re.search(rf"Could not override '{CARDS_GROUP}'\. No match", msg):
        given = next((o for o in overrides if o.startswith(f"{CARDS_GROUP}=")), f"{CARDS_GROUP}=<card>")
        key = given.split("=", 1)[1]
        if key not in {c.key for c in CARDS}:
            return unknown_card(key, f"{given}: ")
        preset = _chosen("hardware", overrides)
        why = " (it has no GPUs)" if made_without_gpus(preset) else ""
        return (f"{given} replaces the card of a GPU preset, and hardware={preset} names none{why}; "
                f"{card_advice(key, group_options('hardware'))}.")
    return None


def explain_config_error(err: BaseException, overrides: list[str] | None = None) -> str:
    """One readable sentence from a Hydra/OmegaConf error, with what to do instead (overrides: the command
    line's, to tell a value it gave from one of the tree's)."""
    msg = str(err).strip()
    card = _card_error(msg, overrides or [])
    if card:
        return card
    m = re.search(r"Could not override '([^']+)'", msg)
    if m and (_is_map(m.group(1)) or _is_map(m.group(1).rsplit(".", 1)[0])):
        key = m.group(1)
        where = key if _is_map(key) else key.rsplit(".", 1)[0]
        entry = key if key != where else f"{where}.<name>"
        return f"{key}: {where} is a free-form map; add an entry with +{entry}=<value> (one override per entry)."
    if m:
        return _not_a_setting(m.group(1))
    m = re.search(r"Could not find '([^/']+)/([^']+)'", msg)
    if m:
        group, name = m.groups()
        options = [
            line.strip() for line in msg.split("Available options in")[-1].splitlines()[1:]
            if line.startswith(("\t", " ")) and line.strip() and not line.strip().startswith("base_")
            and "provider=" not in line and not line.strip().startswith("Config search path")
        ]
        options = options[: options.index("Config search path:")] if "Config search path:" in options else options
        return f"{group}={name} is not in conf/{group}/; choose one of: {', '.join(options)}."
    m = re.search(r"Key '([^']+)' not in '([^']+)'(?:.*?full_key: (\S+))?", msg, re.S)
    if m:
        key = m.group(3) or m.group(1)
        in_file = re.search(r"In '([^']+)':", msg)  # a key in a YAML file of the tree, not an override
        return (f"conf/{in_file.group(1)}.yaml: " if in_file else "") + _not_a_setting(key)
    m = re.search(r"In '([^']+)': \w+ raised while composing config:\n(.+?)\n\s*full_key: (\S+)", msg)
    if m:
        return f"conf/{m.group(1)}.yaml: {m.group(3)}: {m.group(2)}."
    cause = err.__cause__
    if "Error merging override" in msg and cause is not None:
        detail = str(cause).strip().splitlines()[0]
        override = msg.split("Error merging override", 1)[1].strip()
        return f"{override}: {detail}."
    return msg.splitlines()[0] if msg else type(err).__name__
