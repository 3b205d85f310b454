"""A folder that holds a run is never overwritten: `rlgen train` into it (plainly, with resume=auto and other maths,
with resume=<another run>, or a sweep into a fixed folder) is refused in one sentence before anything is written,
unless it continues that run; existing_run=new runs in a folder of its own beside it, existing_run=replace deletes the
other run's files first. docs/durability.md, "A folder that already holds a run"."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlgen.runtime.durability.run_folder import RunDirHeld, held_run

TRAIN = [sys.executable, "-m", "rlgen.cli", "train", "progress=false", "algo.prompts_per_step=4",
         "algo.samples_per_prompt=4"]


def train(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TRAIN, *overrides], cwd=cwd, capture_output=True, text=True, timeout=300)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under folder, by its relative path, with a digest of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".rlgen.lock"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-step run with its checkpoint."""
    root = tmp_path_factory.mktemp("runs")
    done = train(root, "steps=2", f"hydra.run.dir={root / 'done'}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return root / "done"


@pytest.mark.parametrize("change", [
    ["resume=auto", "algo.lr=0.01"],  # resume=auto finds no run with these maths: was "starting a new run" in it
    ["resume=auto", "seed=1"],
    ["resume=auto", "algo.partial_rollouts=0.25"],
    [],  # a plain rerun into the folder: was silent, exit 0
])
def test_a_new_run_into_a_folder_that_holds_a_run_is_refused_before_it_writes(finished, change):
    before = snapshot(finished)
    got = train(finished.parent, "steps=4", f"hydra.run.dir={finished}", *change)
    assert got.returncode == 2, got.stdout[-2000:] + got.stderr[-2000:]
    lines = [ln for ln in got.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in got.stdout + got.stderr
    said = lines[-1]
    assert said.startswith("error:") and f"{finished} holds a finished run (step 2 of 2, checkpoint step_000002)" \
        in said, said
    assert f"resume={finished} steps=4" in said and "existing_run=new" in said and "existing_run=replace" in said
    if "algo.lr=0.01" in change:
        assert "differ in algo.lr (0.001 -> 0.01)" in said, said
    assert snapshot(finished) == before  # not a byte changed: metrics, checkpoint, final model, Hydra's files


def test_resume_auto_into_its_own_folder_continues_it(finished, tmp_path):
    run = tmp_path / "run"
    assert train(tmp_path, "steps=2", f"hydra.run.dir={run}").returncode == 0
    got = train(tmp_path, "steps=3", f"hydra.run.dir={run}", "resume=auto")
    assert got.returncode == 0, got.stderr[-2000:]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002", "step_000003"]


def test_existing_run_new_writes_beside_it_and_names_the_folder_first(finished):
    before = snapshot(finished)
    got = train(finished.parent, "steps=2", f"hydra.run.dir={finished}", "existing_run=new", "algo.lr=0.01")
    assert got.returncode == 0, got.stderr[-2000:]
    other = finished.with_name(finished.name + "-2")
    first = next(ln for ln in got.stderr.splitlines() if ln.strip())
    assert first == f"note: {finished} holds a finished run (step 2 of 2, checkpoint step_000002); this run writes " \
                    f"to {other} (existing_run=new).", first
    assert snapshot(finished) == before
    assert json.loads((other / "status.json").read_text())["state"] == "finished"
    assert json.loads((other / "plan.json").read_text())["config"]["algo"]["lr"] == 0.01


def test_existing_run_replace_deletes_the_other_runs_files_and_keeps_the_users(tmp_path):
    run = tmp_path / "run"
    assert train(tmp_path, "steps=3", "checkpoint.every=1", "checkpoint.keep=3", f"hydra.run.dir={run}").returncode == 0
    (run / "notes.txt").write_text("mine")
    got = train(tmp_path, "steps=2", f"hydra.run.dir={run}", "existing_run=replace", "algo.lr=0.01")
    assert got.returncode == 0, got.stderr[-2000:]
    assert "its files were deleted (existing_run=replace)" in got.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]  # none of the old run's
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert json.loads((run / "checkpoints/step_000002/state.json").read_text())["config"]["algo"]["lr"] == 0.01
    assert (run / "notes.txt").read_text() == "mine"


def fake_run(folder: Path) -> Path:
    """A folder as a finished run leaves it, as far as held_run reads it."""
    (folder / "checkpoints/step_000001").mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"step": 0}\n')
    (folder / "status.json").write_text(json.dumps({"state": "finished", "step": 1, "steps": 1}))
    return folder


def test_a_sweep_into_a_folder_whose_jobs_hold_runs_is_refused_or_goes_to_its_own(tmp_path):
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0")
    before = snapshot(sweep)
    got = train(tmp_path, "-m", "steps=1,2", f"hydra.sweep.dir={sweep}")
    assert got.returncode == 2, got.stdout[-2000:] + got.stderr[-2000:]
    assert f"{sweep / '0'} holds a finished run" in got.stderr and "hydra.sweep.dir=<folder>" in got.stderr
    assert snapshot(sweep) == before  # Hydra wrote nothing there either


def test_resume_of_another_run_into_a_folder_that_holds_one_is_refused(finished, tmp_path):
    held = fake_run(tmp_path / "held")
    before, theirs = snapshot(held), snapshot(finished)
    got = train(tmp_path, "steps=4", f"resume={finished}", f"hydra.run.dir={held}")
    assert got.returncode == 2, got.stdout[-2000:] + got.stderr[-2000:]
    assert f"{held} holds a finished run" in got.stderr and f"(resume={finished} continues another run)" in got.stderr
    assert snapshot(held) == before and snapshot(finished) == theirs


def test_the_library_call_refuses_a_held_folder_too(tmp_path):
    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan
    from rlgen.runtime.run import run_training

    folder = fake_run(tmp_path / "run")
    before = snapshot(folder)
    with pytest.raises(RunDirHeld, match="holds a finished run"):
        run_training(build_plan(compose_run_config(["steps=1"])), folder)
    assert snapshot(folder) == before
    assert held_run(tmp_path / "empty") is None
    (tmp_path / "rejected/.hydra").mkdir(parents=True)  # a run refused before its first step leaves only these
    (tmp_path / "rejected/run.log").write_text("error\n")
    assert held_run(tmp_path / "rejected") is None
