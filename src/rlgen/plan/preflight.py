"""The validation pass every command runs before anything starts (no Ray, no model build): the plan, the
model folder, every prompt of the task and its reward, the directories, and the machine. `rlgen plan` and
`rlgen train` share it, so a config either fails here, with one sentence per problem, or can run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from rlgen.config import RunConfig
from rlgen.plan.build import Plan, PlanError, build_plan
from rlgen.plan.checks.disk_room import check_room
from rlgen.plan.checks.episodes import check_episode_task
from rlgen.plan.checks.inputs import check_dirs, check_model, check_task
from rlgen.plan.checks.machine import check_environment
from rlgen.plan.checks.spanning import shaped_length_notes
from rlgen.plan.layouts import LayoutOption, faster_layout_line, layout_options
from rlgen.plan.task_bounds import fill_task_bounds


@dataclass
class Report:
    plan: Plan | None
    problems: list[str] = field(default_factory=list)  # the config cannot run as given, anywhere
    machine: list[str] = field(default_factory=list)  # this machine cannot run it (GPUs, packages)
    machine_notes: list[str] = field(default_factory=list)  # it runs here, but not as the config assumes (GPU card)
    notes: list[str] = field(default_factory=list)  # it runs, but likely not as meant (a tool task's model)
    layouts: list[LayoutOption] = field(default_factory=list)  # the hardware's layouts, fastest predicted first

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.plan.warnings if self.plan is not None else ()

    def blocking(self, machine: bool = True) -> list[str]:
        return self.problems + (self.machine if machine else [])


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def preflight(cfg: RunConfig, *, run_dir: Path | None = None, machine: bool = True) -> Report:
    """Every problem of cfg that can be known before start. run_dir: where the run will write (checked for
    writability and, for a new run, for room for everything it writes); machine: also check this machine's GPUs,
    packages and disks against the plan."""

    problems: list[str] = []
    plan = None
    layouts: list[LayoutOption] = []
    try:
        plan = build_plan(cfg)
    except PlanError as err:
        problems += err.problems
    else:
        layouts = layout_options(cfg, plan, build_plan)
        plan = dataclasses.replace(plan, layout_advice=faster_layout_line(layouts) or "")
    cfg = fill_task_bounds(cfg)[0]  # the task's bounds left null, as the plan fills them: the checks read them
    before = len(problems)
    check_model(cfg, problems)
    model_ok = len(problems) == before
    task = check_task(cfg, problems, model_ok=model_ok)
    notes = shaped_length_notes(cfg)
    if model_ok:
        check_episode_task(cfg, task, problems, notes)
    check_dirs(cfg, run_dir, problems)
    on_machine: list[str] = []
    machine_notes: list[str] = []
    if plan is not None and machine:
        check_environment(plan.config, plan, on_machine, machine_notes)
        # a resumed run's own checkpoints count: checked as it starts; bad inputs are said first, on their own
        if run_dir is not None and not cfg.resume and not problems:
            check_room(plan, run_dir, on_machine)
    return Report(plan, _unique(problems), _unique(on_machine), _unique(machine_notes), _unique(notes), layouts)
