"""What `rlgen <command>` was given, read before Hydra sees it: Hydra's own flags, the overrides, and with -m
every job of the sweep. Each mistake becomes one sentence (ConfigError) instead of Hydra's raw text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlgen.config.compose import ConfigError

# Hydra's command-line flags: whether each takes a value (None: an optional one).
FLAGS: dict[str, bool | None] = {
    "--help": False, "-h": False, "--hydra-help": False, "--version": False, "--resolve": False,
    "--run": False, "-r": False, "--multirun": False, "-m": False, "--shell-completion": False, "-sc": False,
    "--cfg": True, "-c": True, "--package": True, "-p": True, "--config-path": True, "-cp": True,
    "--config-name": True, "-cn": True, "--config-dir": True, "-cd": True, "--experimental-rerun": True,
    "--info": None, "-i": None,
}
CFG_VALUES = ("job", "hydra", "all")
INFO_VALUES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
PRINT_ONLY = {"--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"}
OWN_CONFIG = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}


@dataclass
class Args:
    flags: list[str] = field(default_factory=list)  # Hydra's flags with their values, as given
    overrides: list[str] = field(default_factory=list)  # key=value, +key=value, ~key, hydra.*
    multirun: bool = False
    print_only: bool = False  # --help, --cfg, --info ...: Hydra prints something, nothing runs
    own_config: bool = False  # --config-dir and friends: the config tree is not only rlgen's

    @property
    def settings(self) -> list[str]:
        """Overrides of rlgen's settings (Hydra's own hydra.* and hydra/ overrides left out)."""
        return [o for o in self.overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]


def split_argv(command: str, argv: list[str]) -> Args:
    """Sort argv into Hydra flags and overrides; raises ConfigError on a flag Hydra does not have, a flag
    without its value, or a word that is not key=value."""
    args = Args()
    i = 0
    while i < len(argv):
        tok = argv[i]
        name, eq, inline = tok.partition("=")
        if tok.startswith("-") and name in FLAGS:
            flag = name
            takes = FLAGS[flag]
            value = inline if eq else None
            if value is None and takes is not False and i + 1 < len(argv) and not argv[i + 1].startswith("-") \
                    and (takes is True or argv[i + 1] in INFO_VALUES):
                i += 1
                value = argv[i]
            if takes is True and value is None:
                raise ConfigError(f"{flag} needs a value, e.g. rlgen {command} {_example(flag)}.")
            if flag in ("--cfg", "-c") and value not in CFG_VALUES:
                raise ConfigError(f"{flag} {value} is not one of {', '.join(CFG_VALUES)}; e.g. rlgen {command} --cfg job.")
            if flag in ("--info", "-i") and value is not None and value not in INFO_VALUES:
                raise ConfigError(f"{flag} {value} is not one of {', '.join(INFO_VALUES)}.")
            args.flags += [flag] + ([value] if value is not None else [])
            args.multirun |= flag in ("-m", "--multirun")
            args.print_only |= flag in PRINT_ONLY
            args.own_config |= flag in OWN_CONFIG
        elif tok.startswith("-"):
            raise ConfigError(
                f"{tok} is not an option of rlgen {command}; settings are key=value (e.g. steps=40), and the "
                "options are -m (sweep), --cfg job (print the config) and --help."
            )
        elif "=" not in tok and not tok.startswith("~"):
            raise ConfigError(
                f"{tok!r} is not a setting: write key=value, e.g. {tok}=<value> (rlgen {command} --cfg job lists "
                "every key)."
            )
        else:
            args.overrides.append(tok)
        i += 1
    return args


def _example(flag: str) -> str:
    return {"--cfg": "--cfg job", "-c": "-c job", "--config-dir": "--config-dir ./conf", "-cd": "-cd ./conf"}.get(
        flag, f"{flag} <value>")


def jobs(args: Args) -> list[list[str]]:
    """The settings of every job: one list for a run, one per point of a -m sweep. Parse errors of an
    override become ConfigError."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(args.settings)
    except HydraException as err:
        raise ConfigError(explain_parse_error(str(err))) from err
    sweeps = [o for o in parsed if o.is_sweep_override()]
    if sweeps and not args.multirun:
        o = sweeps[0]
        raise ConfigError(
            f"{o.input_line} lists several values, which only a sweep runs; add -m (rlgen train -m {o.input_line}) "
            "or give one value."
        )
    if not args.multirun:
        return [args.settings]
    try:
        batches = BasicSweeper.split_arguments(parsed, None)
    except HydraException as err:
        raise ConfigError(explain_parse_error(str(err))) from err
    return [list(job) for batch in batches for job in batch] or [[]]


def explain_parse_error(msg: str) -> str:
    """One sentence from Hydra's override parser error."""

    lines = [ln for ln in msg.splitlines() if ln.strip() and not ln.startswith("See https")]
    m = re.search(r"Error (?:parsing|when parsing) override '([^']*)'", msg)
    lexer = re.match(r"LexerNoViableAltException: (.*)", lines[0]) if lines else None
    if lexer and len(lines) > 1 and "^" in lines[1]:  # the input, then a caret under the character
        text, col = lexer.group(1), lines[1].index("^") - len("LexerNoViableAltException: ")
        ch = text[col] if 0 <= col < len(text) else "?"
        key = text.split("=", 1)[0]
        return (f"{text}: the override cannot be read at {ch!r}; quote the value, e.g. "
                f"'{key}=\"{text.split('=', 1)[-1]}\"'.")
    where = f"{m.group(1)}: " if m else ""
    detail = next((ln.strip() for ln in lines[1:]), lines[0] if lines else msg) if m else (lines[0] if lines else msg)
    return (f"{where}the override cannot be read ({detail}); write key=value and quote values with spaces, "
            "brackets or other characters, e.g. 'task.alphabet=\"ab cd\"'.")
