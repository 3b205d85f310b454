"""A Run holds only what it declares: set-up, the loop and checkpoints share it, so each of its parts has one
declared name and type, and a name set by mistake raises instead of quietly adding an attribute."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.runtime.cluster.waits import Waiter
from rlgen.runtime.run_handle import Run
from rlgen.runtime.signals import StopFlag
from rlgen.runtime.state.breaker import CircuitBreaker
from rlgen.runtime.state.run_state import RunState

RUNTIME = Path(__file__).resolve().parents[2] / "src" / "rlgen" / "runtime"


def _run(tmp_path: Path) -> Run:
    plan = build_plan(compose_run_config([]))
    stop = StopFlag()
    return Run(plan, tmp_path, Console(), stop, Waiter(10, stop, tmp_path),
               RunState.start(plan.async_steps, CircuitBreaker(plan.config.monitor, tmp_path)))


def test_a_name_the_run_does_not_declare_cannot_be_set(tmp_path):
    run = _run(tmp_path)
    with pytest.raises(AttributeError):
        run.not_a_field = 1
    with pytest.raises(AttributeError):
        run.placment = None  # a misspelt field
    assert not hasattr(run, "__dict__")


def test_the_fields_set_up_fills_in_are_declared_and_take_their_values(tmp_path):
    run = _run(tmp_path)
    run.placement, run.start_version, run.zero3_gatherers = None, 3, []
    assert (run.placement, run.start_version, run.zero3_gatherers) == (None, 3, [])
    assert run.cfg is run.plan.config and run.engines == [] and run.learner is None


def test_every_field_has_a_type_and_none_is_any():
    fields = dataclasses.fields(Run)
    assert {"placement", "zero3_gatherers", "start_version"} <= {f.name for f in fields}
    untyped = [f.name for f in fields if not f.type or "Any" in str(f.type)]
    assert untyped == []


def _attributes_set_on_run(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each ``run.<name> = ...`` (also in tuples, augmented, or through setattr(run, "<name>"))."""
    found = []

    def targets(t: ast.expr) -> list[ast.expr]:
        return [x for e in t.elts for x in targets(e)] if isinstance(t, (ast.Tuple, ast.List)) else [t]

    for node in ast.walk(tree):
        outs: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            outs = [x for t in node.targets for x in targets(t)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            outs = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            obj, name = node.args[0], node.args[1]
            if isinstance(obj, ast.Name) and obj.id == "run" and isinstance(name, ast.Constant):
                found.append((node.lineno, str(name.value)))
        for t in outs:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "run":
                found.append((t.lineno, t.attr))
    return found


def test_the_runtime_sets_only_declared_fields_on_a_run():
    declared = {f.name for f in dataclasses.fields(Run)}
    seen, stray = set(), []
    for path in sorted(RUNTIME.rglob("*.py")):
        for line, name in _attributes_set_on_run(ast.parse(path.read_text())):
            seen.add(name)
            if name not in declared:
                stray.append(f"{path.relative_to(RUNTIME)}:{line}: run.{name}")
    assert stray == []
    assert {"placement", "zero3_gatherers", "start_version", "learners_pending"} <= seen  # the scan finds set-up's


def test_the_scan_finds_an_undeclared_name():
    tree = ast.parse("run.a = 1\nrun.b, (run.c, x) = 2, (3, 4)\nrun.d += 1\nsetattr(run, 'e', 5)\nother.f = 6\n")
    assert sorted(name for _, name in _attributes_set_on_run(tree)) == list("abcde")
