"""A Run is three parts and holds only what they declare: set-up, the loop and checkpoints share it, so each piece
has one declared name and type, a name set by mistake raises instead of quietly adding an attribute, and what
set-up built cannot change once set-up is done."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.runtime.cluster.waits import Waiter
from rlgen.runtime.run_handle import Built, Run, Services
from rlgen.runtime.signals import StopFlag
from rlgen.runtime.state.breaker import CircuitBreaker
from rlgen.runtime.state.run_state import RunState

RUNTIME = Path(__file__).resolve().parents[2] / "src" / "rlgen" / "runtime"
PARTS = {"run": Run, "built": Built, "services": Services, "state": RunState}


def _run(tmp_path: Path) -> Run:
    plan = build_plan(compose_run_config([]))
    stop = StopFlag()
    return Run(plan, tmp_path, Built(), RunState.start(plan.async_steps, CircuitBreaker(plan.config.monitor, tmp_path)),
               Services(Console(), stop, Waiter(10, stop, tmp_path)))


def test_a_run_is_its_plan_its_folder_and_three_parts():
    assert [f.name for f in dataclasses.fields(Run)] == ["plan", "out_dir", "built", "state", "services"]


def test_a_name_the_run_does_not_declare_cannot_be_set(tmp_path):
    run = _run(tmp_path)
    with pytest.raises(AttributeError):
        run.not_a_field = 1
    with pytest.raises(AttributeError):
        run.built.placment = None  # a misspelt field
    with pytest.raises(AttributeError):
        run.services.consle = None
    assert not hasattr(run, "__dict__") and not hasattr(run.built, "__dict__")


def test_what_set_up_built_is_frozen_once_it_is_done(tmp_path):
    run = _run(tmp_path)
    run.built.placement, run.built.start_version, run.built.zero3_gatherers = None, 3, []
    assert (run.built.placement, run.built.start_version, run.built.zero3_gatherers) == (None, 3, [])
    assert run.cfg is run.plan.config and run.built.engines == [] and run.built.learner is None
    run.built.freeze()
    with pytest.raises(AttributeError, match="set up"):
        run.built.start_version = 4
    assert run.built.start_version == 3
    run.state.step, run.services.sink = 5, None  # state and services go on changing
    assert run.state.step == 5


def test_learners_ready_ends_set_up(tmp_path):
    class Done:
        def result(self, stop, what):
            self.asked = what

    run = _run(tmp_path)
    run.built.learners_pending = pending = Done()
    run.learners_ready()
    assert pending.asked and run.built.learners_pending is None and run.built.frozen
    run.learners_ready()  # nothing left to wait for


def test_every_field_has_a_type_and_none_is_any():
    for part in (Run, Built, Services):
        untyped = [f.name for f in dataclasses.fields(part) if not f.type or "Any" in str(f.type)]
        assert untyped == [], part.__name__
    assert {"placement", "zero3_gatherers", "start_version"} <= {f.name for f in dataclasses.fields(Built)}


def _attributes_set(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, part, name) of each ``run.<name> = ...``, ``run.<part>.<name> = ...`` or ``<part>.<name> = ...`` (also
    in tuples, augmented, or through setattr), part one of run, built, services, state."""
    found = []

    def targets(t: ast.expr) -> list[ast.expr]:
        return [x for e in t.elts for x in targets(e)] if isinstance(t, (ast.Tuple, ast.List)) else [t]

    def owner(obj: ast.expr) -> str | None:
        if isinstance(obj, ast.Name) and obj.id in PARTS:
            return obj.id
        if isinstance(obj, ast.Attribute) and isinstance(obj.value, ast.Name) and obj.value.id == "run":
            return obj.attr if obj.attr in PARTS else None
        return None

    for node in ast.walk(tree):
        outs: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            outs = [x for t in node.targets for x in targets(t)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            outs = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            obj, name = node.args[0], node.args[1]
            if owner(obj) and isinstance(name, ast.Constant):
                found.append((node.lineno, owner(obj), str(name.value)))
        for t in outs:
            if isinstance(t, ast.Attribute) and owner(t.value):
                found.append((t.lineno, owner(t.value), t.attr))
    return found


def test_the_runtime_sets_only_declared_fields_on_a_run():
    declared = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in PARTS.items()}
    seen, stray = set(), []
    for path in sorted(RUNTIME.rglob("*.py")):
        for line, part, name in _attributes_set(ast.parse(path.read_text())):
            seen.add((part, name))
            if name not in declared[part]:
                stray.append(f"{path.relative_to(RUNTIME)}:{line}: {part}.{name}")
    assert stray == []
    # the scan finds set-up's
    assert {("built", "placement"), ("built", "zero3_gatherers"), ("built", "start_version"),
            ("built", "learners_pending"), ("services", "sink")} <= seen


def test_the_scan_finds_an_undeclared_name():
    tree = ast.parse("run.a = 1\nrun.built.b, (built.c, x) = 2, (3, 4)\nrun.services.d += 1\n"
                     "setattr(run, 'e', 5)\nother.f = 6\n")
    assert sorted(name for _, _, name in _attributes_set(tree)) == list("abcde")
