"""Before a Hydra app starts: the command line is read, every job's config composed and, for `train`, the
validation pass run. Problems print one sentence each and the command exits 2, before Ray or a model build.
Where the run writes is fixed next, by rlgen.commands.run_dirs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rlgen.commands.args import Args, jobs, split_argv
from rlgen.config import RunConfig, plain
from rlgen.config.compose import ConfigError, compose_run_config
from rlgen.plan.preflight import preflight
from rlgen.runtime.durability.resume import ResumeError, identity, resolve_explicit
from rlgen.serve.checks import serve_problems

# The plans of the configs this process has already validated, by config: the Hydra job takes its plan from here
# instead of building it again (a sweep point that failed the pass is not here, so its job records why it was
# rejected).
PLANNED: dict[str, Any] = {}
# The last `rlgen train` command line's jobs, in the sweep's order: each config and its plan (None: refused), for
# the run directory's checks before Hydra starts (rlgen.commands.run_dirs).
TRAIN_JOBS: list[tuple[RunConfig, Any]] = []


def config_key(cfg: RunConfig) -> str:
    return json.dumps(plain(cfg), sort_keys=True, default=str)


def planned(cfg: RunConfig) -> Any:
    """The plan the command line built for cfg (None when it built none)."""
    return PLANNED.get(config_key(cfg))


def print_problems(problems: list[str], console: Console | None = None) -> int:
    console = console or Console(stderr=True, soft_wrap=True)
    if len(problems) == 1:
        console.print(f"[bold red]error:[/] {escape(problems[0])}", highlight=False)
    else:
        console.print(f"[bold red]error:[/] {len(problems)} problems:", highlight=False)
        for p in problems:
            console.print(f"- {escape(p)}", highlight=False)
    return 2


def run_dir_hint(args: Args) -> Path:
    """Where Hydra will put the run: hydra.run.dir (hydra.sweep.dir with -m) up to its first interpolation."""
    key = "hydra.sweep.dir=" if args.multirun else "hydra.run.dir="
    given = next((o.split("=", 1)[1] for o in args.overrides if o.lstrip("+").startswith(key)), None)
    fixed = (given or ("multirun" if args.multirun else "outputs")).split("${", 1)[0]
    return Path(fixed or ".").expanduser()


def compose_jobs(command: str, argv: list[str]) -> tuple[Args, list[RunConfig]]:
    """The command line read and every job composed; raises ConfigError."""
    args = split_argv(command, argv)
    if args.own_config:
        return args, []
    hydra_overrides = [o for o in args.overrides if o not in args.settings]
    return args, [compose_run_config(job, hydra_overrides=hydra_overrides) for job in jobs(args)]


def check_command(command: str, argv: list[str]) -> int | None:
    """An exit code when the command cannot start, None to hand it to Hydra."""
    TRAIN_JOBS.clear()
    try:
        args, cfgs = compose_jobs(command, argv)
    except ConfigError as err:
        return print_problems([str(err)])
    if args.print_only or not cfgs:
        return None
    if command == "serve":

        checked = [(cfg, *serve_problems(cfg)) for cfg in cfgs]
        problems = [p for _, _, found in checked for p in found]
        if problems:
            return print_problems(list(dict.fromkeys(problems)))
        PLANNED.update((config_key(cfg), plan) for cfg, plan, _ in checked)
        return None
    if command != "train":
        return None
    return check_train(args, cfgs)


def check_train(args: Args, cfgs: list[RunConfig]) -> int | None:
    run_dir = run_dir_hint(args)
    reports = [preflight(cfg, run_dir=run_dir) for cfg in cfgs]
    blocking = [r.blocking() for r in reports]
    for cfg, problems, report in zip(cfgs, blocking, reports):
        if not problems and cfg.resume and cfg.resume != "auto":
            try:
                resolve_explicit(cfg.resume, identity(report.plan.config, len(report.plan.learners)))
            except ResumeError as err:
                problems.append(str(err))
    bad = [p for p in blocking if p]
    for note in dict.fromkeys(n for r, problems in zip(reports, blocking) if not problems
                              for n in r.notes + r.machine_notes):
        Console(stderr=True, soft_wrap=True).print(f"[yellow]warning:[/] {escape(note)}", highlight=False)
    if bad and (not args.multirun or len(bad) == len(cfgs)):
        return print_problems(list(dict.fromkeys(p for problems in bad for p in problems)))
    if bad:
        from rlgen.commands.sweep import common_overrides, point_label

        points = jobs(args)
        common = common_overrides(points)
        said = "; ".join(f"{point_label(points[i], common)} ({' '.join(problems).rstrip('.')})"
                         for i, problems in enumerate(blocking) if problems)
        Console(stderr=True, soft_wrap=True).print(
            f"[yellow]note:[/] {len(bad)} of {len(cfgs)} sweep points cannot run; the others run, and the sweep "
            f"exits 2 at the end: {escape(said)}.", highlight=False)
    PLANNED.update((config_key(cfg), report.plan) for cfg, problems, report in zip(cfgs, blocking, reports)
                   if not problems)
    TRAIN_JOBS[:] = [(cfg, None if problems else report.plan) for cfg, problems, report in zip(cfgs, blocking, reports)]
    return None
