"""`rlgen plan`: resolve and check a config without running it. It runs the same validation pass as `train`;
what this machine lacks (GPUs, packages) is shown as a note, since a plan is often made for another machine."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rlgen.commands.checks import compose_jobs, print_problems
from rlgen.config.compose import ConfigError
from rlgen.plan.checks.inputs import writable
from rlgen.plan.prediction import predict
from rlgen.plan.preflight import preflight
from rlgen.plan.view import print_layouts, print_plan_and_prediction

USAGE = """usage: rlgen plan [overrides ...] [--json PATH] [--cfg job]

  Resolve the config, check it (placement, batch, lengths, model folder, data, reward) and print where every
  engine and learner runs, with the predicted balance. Nothing starts. --json writes the plan to PATH;
  --cfg job prints the composed config instead."""


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    json_path, argv = _take_json(argv)
    if isinstance(json_path, int):
        return json_path
    if "-m" in argv or "--multirun" in argv:
        return print_problems(["rlgen plan takes one config; sweep with rlgen train -m ... instead."])
    try:
        args, cfgs = compose_jobs("plan", argv)
        extra = [f for f in args.flags if f not in ("--cfg", "-c", "job")]
        if extra or args.own_config:
            raise ConfigError(f"rlgen plan does not take {' '.join(extra or args.flags)}; it takes overrides, --json "
                              "PATH and --cfg job.")
    except ConfigError as err:
        return print_problems([str(err)])
    cfg = cfgs[0]
    if "--cfg" in args.flags or "-c" in args.flags:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(OmegaConf.structured(cfg)), end="")
        return 0
    report = preflight(cfg)
    if report.problems:
        return print_problems(report.problems)

    console = Console(soft_wrap=True)
    print_plan_and_prediction(report.plan, console)
    print_layouts(report.layouts, console)
    for m in report.machine:
        console.print(f"[yellow]this machine cannot run it:[/] {escape(m)}", highlight=False)
    for m in report.machine_notes:
        console.print(f"[yellow]on this machine:[/] {escape(m)}", highlight=False)
    for m in report.notes:
        console.print(f"[yellow]warning:[/] {escape(m)}", highlight=False)
    if json_path:

        path = Path(json_path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**report.plan.to_dict(), "prediction": predict(report.plan).to_dict(),
                                    "layouts": [dataclasses.asdict(o) for o in report.layouts]}, indent=2) + "\n")
        print(f"plan written to {json_path}")
    return 0


def _take_json(argv: list[str]) -> tuple[str | int | None, list[str]]:
    """(--json's path, the other arguments); an exit code in place of the path when --json is wrong."""
    if "--json" not in argv:
        return None, argv
    i = argv.index("--json")
    if i + 1 >= len(argv) or "=" in argv[i + 1] or argv[i + 1].startswith("-"):
        return print_problems(["--json needs a file path, e.g. rlgen plan --json plan.json"]), argv
    path = argv[i + 1]
    if Path(path).expanduser().is_dir():
        return print_problems([f"--json {path} is a folder; give a file path, e.g. --json {path.rstrip('/')}/plan.json"]), argv

    if why := writable(Path(path).expanduser().parent):
        return print_problems([f"--json {path} cannot be written: {why}; choose another path."]), argv
    return path, argv[:i] + argv[i + 2 :]
