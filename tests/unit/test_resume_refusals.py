"""resume= that cannot be honoured is refused as the user types it, before Ray or a run starts, with exit 2 and one
sentence: a run already at (or past) steps=, and a checkpoint whose state.json is torn (named, with the older
checkpoint to resume from instead, which the command line then takes)."""

from __future__ import annotations

import json
from pathlib import Path

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.runtime.durability.checkpoint_folder import STATE_FILE, write_checkpoint
from rlgen.runtime.durability.resume import identity


def _run_with(run: Path, *steps: int) -> None:
    """A run directory with a complete checkpoint at each step, as a run with the default settings writes them."""
    ident = identity(build_plan(compose_run_config([])).config, 1)
    for step in steps:
        write_checkpoint(run, step, lambda tmp: None, {"step": step, **ident}, {"flights": []}, keep=len(steps))


def _rlgen(capsys, *argv: str) -> tuple[int, str]:
    from rlgen.cli import main

    try:
        rc = main(list(argv))
    except SystemExit as exit_:
        rc = exit_.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, " ".join(err.split())


def test_resuming_a_finished_run_with_no_more_steps_is_refused(tmp_path, capsys, monkeypatch, tripwires):
    monkeypatch.chdir(tmp_path)
    _run_with(tmp_path / "done", 150)
    rc, err = _rlgen(capsys, "train", "resume=done", "steps=3", "progress=false")
    assert rc == 2
    assert err.startswith("error: resume=done: its checkpoint is at step 150 already, so steps=3 leaves nothing to "
                          "train; set steps= above 150 (e.g. steps=300) to train it further")
    rc, err = _rlgen(capsys, "train", "resume=done", "steps=150", "progress=false")
    assert rc == 2 and "steps=150 leaves nothing to train" in err
    assert not (tmp_path / "outputs").exists()  # refused before Hydra made a run directory


def test_resume_auto_that_picks_a_finished_run_is_refused(tmp_path, capsys, monkeypatch, tripwires):
    monkeypatch.chdir(tmp_path)
    _run_with(tmp_path / "outputs" / "old", 150)
    rc, err = _rlgen(capsys, "train", "resume=auto", "steps=3", "progress=false", "hydra.run.dir=outputs/new")
    assert rc == 2
    assert "error: resume=auto: the newest run with these settings, outputs/old, is at step 150 already, so steps=3 " \
           "leaves nothing to train" in err


def _tear(checkpoint: Path) -> Path:
    state = checkpoint / STATE_FILE
    state.write_text(state.read_text()[:36])  # cut short, as by a full disk
    return state


def test_a_torn_state_json_is_named_with_the_checkpoint_to_fall_back_to(tmp_path, capsys, monkeypatch, tripwires):
    monkeypatch.chdir(tmp_path)
    _run_with(tmp_path / "run", 50, 100)
    _tear(tmp_path / "run" / "checkpoints" / "step_000100")
    rc, err = _rlgen(capsys, "train", "resume=run", "steps=200", "progress=false")
    assert rc == 2
    assert err == ("error: resume=run: run/checkpoints/step_000100/state.json is not valid JSON at line 1 column 37 "
                   "(cut short, or changed), so checkpoint step_000100 cannot be resumed; resume from the one before "
                   "with resume=run/checkpoints/step_000050.")
    from rlgen.commands.checks import check_command

    assert check_command("train", ["resume=run/checkpoints/step_000050", "steps=200"]) is None  # the fix is taken


def test_a_torn_state_json_without_an_older_checkpoint(tmp_path, capsys, monkeypatch, tripwires):
    monkeypatch.chdir(tmp_path)
    _run_with(tmp_path / "outputs" / "old", 100)
    _tear(tmp_path / "outputs" / "old" / "checkpoints" / "step_000100")
    rc, err = _rlgen(capsys, "train", "resume=auto", "steps=200", "progress=false", "hydra.run.dir=outputs/new")
    assert rc == 2
    assert ("error: resume=auto: outputs/old/checkpoints/step_000100/state.json is not valid JSON at line 1 column 37 "
            "(cut short, or changed), so checkpoint step_000100 cannot be resumed; the run has no older complete "
            "checkpoint; drop resume= to start a new run.") in err


def test_resume_from_a_checkpoint_folder_continues_its_run_from_it(tmp_path):
    from rlgen.runtime.durability.resume import resolve_explicit

    _run_with(tmp_path / "run", 50, 100)
    ident = identity(build_plan(compose_run_config([])).config, 1)
    point = resolve_explicit(str(tmp_path / "run" / "checkpoints" / "step_000050"), ident)
    assert point.run_dir == tmp_path / "run" and point.step == 50
    assert json.loads((point.checkpoint / STATE_FILE).read_text())["step"] == 50
