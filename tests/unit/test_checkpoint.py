"""Checkpoint folders (atomic writes, torn ones skipped, pruning), the RNG round trip, what resume= accepts,
and the per-step check that every prompt is scored exactly once."""

from __future__ import annotations

import random

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.runtime.durability.checkpoint_folder import (
    MARKER,
    capture_rng,
    list_checkpoints,
    newest_checkpoint,
    read_state,
    restore_rng,
    torn_checkpoints,
    write_checkpoint,
)
from rlgen.runtime.durability.resume import (
    ResumeError,
    changes,
    identity,
    math_keys,
    resolve_auto,
    resolve_explicit,
)
from rlgen.runtime.rollouts.batch import RolloutCountError, StepPrompts, check_complete
from rlgen.tasks.base import Prompt
from rlgen.types import Completion


def _write(run, step, keep=2, fill=None):
    return write_checkpoint(run, step, fill or (lambda tmp: (tmp / "model").mkdir()), {"step": step}, {"flights": []}, keep)


def test_a_checkpoint_is_complete_only_with_its_marker(tmp_path):
    path = _write(tmp_path, 5)
    assert path.name == "step_000005" and (path / MARKER).is_file() and (path / "model").is_dir()
    assert read_state(path)["step"] == 5 and "contents" in read_state(path)
    assert list_checkpoints(tmp_path) == [path]


def test_a_write_that_fails_leaves_nothing_that_looks_complete(tmp_path):
    _write(tmp_path, 5)

    def crash(tmp):
        (tmp / "model").mkdir()
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _write(tmp_path, 10, fill=crash)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000005"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000005"]  # no temporary folder left


def test_torn_folders_are_skipped_and_pruned(tmp_path):
    _write(tmp_path, 5, keep=5)
    torn = _write(tmp_path, 10, keep=5)
    (torn / MARKER).unlink()  # as if the process died before the marker went in
    assert newest_checkpoint(tmp_path).name == "step_000005"
    assert torn_checkpoints(tmp_path) == [torn]
    _write(tmp_path, 15, keep=5)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000005", "step_000015"]
    assert not torn.exists()


def test_only_the_newest_keep_checkpoints_stay(tmp_path):
    for step in (2, 4, 6, 8):
        _write(tmp_path, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000006", "step_000008"]


def test_rng_states_round_trip():
    import numpy as np
    import torch

    state = capture_rng()
    a = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == a


# -- resume= ---------------------------------------------------------------------------------------------
def _ident(*overrides, ranks=1):
    cfg = compose_run_config(list(overrides))
    return identity(build_plan(cfg).config, ranks)  # as a run records it: with the plan's resolved values


def test_math_keys_are_told_from_safe_ones():
    diff = changes(_ident(), _ident("algo.lr=0.002", "steps=90", "timeout_s=30", "engine.num_engines=2", "seed=3"))
    assert set(diff) == {"algo.lr", "steps", "timeout_s", "engine.num_engines", "seed"}
    assert sorted(math_keys(diff)) == ["algo.lr", "seed"]
    assert math_keys(changes(_ident(), _ident(ranks=2))) == ["learner_ranks"]


def test_a_setting_newer_than_the_checkpoint_is_no_change_at_its_default():
    saved = _ident()
    for key in ("precision", "deterministic"):  # a checkpoint written before these settings existed
        del saved["config"][key]
    del saved["config"]["algo"]["tis_low"]
    assert changes(saved, _ident()) == {}
    assert set(changes(saved, _ident("deterministic=true", "algo.tis_low=0.5", "algo.tis_mode=mask"))) == {
        "deterministic", "algo.tis_low", "algo.tis_mode"}


def _saved_run(tmp_path, *overrides):
    run = tmp_path / "run"
    ident = _ident(*overrides)
    write_checkpoint(run, 7, lambda tmp: None, {"step": 7, **ident}, {"flights": []}, 2)
    return run


def test_explicit_resume_refuses_changed_math_and_names_the_keys(tmp_path):
    run = _saved_run(tmp_path)
    with pytest.raises(ResumeError, match=r"different algo\.lr \(0\.001 -> 0\.002\).*drop resume="):
        resolve_explicit(str(run), _ident("algo.lr=0.002"))
    point = resolve_explicit(str(run), _ident("steps=100", "timeout_s=60"))
    assert point.step == 7 and set(point.changes) == {"steps", "timeout_s"}


def test_explicit_resume_of_a_missing_or_empty_run_says_what_to_do(tmp_path):
    with pytest.raises(ResumeError, match="no such run directory"):
        resolve_explicit(str(tmp_path / "nope"), _ident())
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResumeError, match="no complete checkpoint"):
        resolve_explicit(str(tmp_path / "empty"), _ident())


def test_explicit_resume_of_a_file_says_it_is_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ResumeError) as err:
        resolve_explicit(str(tmp_path / "notes.txt"), _ident())
    assert str(err.value) == (f"resume={tmp_path / 'notes.txt'} is a file, not a run directory; give the folder a "
                              "stopped run printed (it holds checkpoints/), or use resume=auto.")
    run = _saved_run(tmp_path)  # a file of a run directory: the sentence names the run directory
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(ResumeError, match=rf"is a file, not a run directory.*\(the run directory it is in: "
                                          rf"resume={run}\)"):
        resolve_explicit(str(run / "metrics.jsonl"), _ident())


def test_a_changed_task_file_is_refused(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    run = _saved_run(tmp_path, "task=jsonl", f"task.path={rows}")
    rows.write_text('{"prompt": "1+2=", "answer": "3"}\n')
    with pytest.raises(ResumeError, match="the contents of task.path"):
        resolve_explicit(str(run), _ident("task=jsonl", f"task.path={rows}"))


def test_auto_picks_a_run_with_the_same_math_under_the_output_root(tmp_path):
    root = tmp_path / "outputs"
    other = root / "2026-01-01" / "09-00-00"
    write_checkpoint(other, 3, lambda tmp: None, {"step": 3, **_ident("algo.lr=0.5")}, {"flights": []}, 2)
    mine = root / "2026-01-01" / "10-00-00"
    write_checkpoint(mine, 4, lambda tmp: None, {"step": 4, **_ident()}, {"flights": []}, 2)
    fresh = root / "2026-01-02" / "08-00-00"
    fresh.mkdir(parents=True)
    point, note = resolve_auto(fresh, root, _ident("steps=99"))
    assert point is not None and point.run_dir == mine and point.step == 4 and note == ""
    point, note = resolve_auto(fresh, root, _ident("algo.lr=0.25"))
    assert point is None and "starting a new run" in note and "algo.lr" in note


# -- every prompt exactly once -------------------------------------------------------------------------
def _sp():
    return StepPrompts(0, [Prompt("a", "1"), Prompt("b", "2")], [[1], [2]])


def _c(group, prompt):
    return Completion(group, [prompt], [5], [-0.1], "stop", 0)


def test_check_complete_accepts_n_per_prompt_and_refuses_a_lost_or_doubled_one():
    check_complete([_c(0, 1), _c(0, 1), _c(1, 2), _c(1, 2)], _sp(), 2)
    with pytest.raises(RolloutCountError, match="1 do not"):
        check_complete([_c(0, 1), _c(0, 1), _c(1, 2)], _sp(), 2)
    with pytest.raises(RolloutCountError, match="1 do not"):
        check_complete([_c(0, 1), _c(0, 1), _c(1, 2), _c(1, 2), _c(1, 2)], _sp(), 2)
    with pytest.raises(RolloutCountError, match="belongs to no prompt"):
        check_complete([_c(0, 2), _c(0, 1), _c(1, 2), _c(1, 2)], _sp(), 2)
