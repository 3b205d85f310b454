"""Room on disk before the first step: the plan knows what a run writes (each checkpoint's weights and optimizer
state, how many are on disk at once, final_model/merged, a preset model to build), `rlgen train` refuses a disk
that cannot hold it in one sentence with the fixes, a resumed run's sentence gives the command that resumes it, and
the end of a run whose disk filled since it began keeps the trained weights where they fit."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.errors import UserError
from rlgen.plan import build_plan
from rlgen.plan.checks.disk_room import OnDisk, needed_with_headroom, room_problems, run_dir_bytes, size_text
from rlgen.plan.disk import checkpoints_at_once, checkpoints_written
from rlgen.plan.preflight import preflight
from rlgen.plan.view import checkpoint_line
from rlgen.runtime.durability.checkpoint_folder import (
    begin_checkpoint,
    finish_checkpoint,
    list_checkpoints,
    write_checkpoint,
)
from rlgen.runtime.durability.disk_space import DiskFull, DiskTooSmall, check_run_fits
from rlgen.runtime.durability.final_checkpoint import save_final
from rlgen.runtime.durability.resume import resume_clause

SEVEN_B = ["engine=vllm", "hardware=2xh200", "model=qwen2_5_7b", "steps=3", "checkpoint.every=0"]


def _plan(overrides):
    return build_plan(compose_run_config(overrides))


def _free(n):
    return lambda path: n


# -- what a run writes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("every, steps, start, written", [
    (50, 150, 0, 3),  # steps 50, 100 and the final one at 150
    (0, 150, 0, 1),  # checkpoint.every=0: the final one still
    (5, 5, 0, 1),  # a periodic one at the last step is the final one
    (2, 8, 2, 3),  # resumed at step 2: 4, 6 and the final one
    (50, 150, 100, 1),
])
def test_the_checkpoints_a_run_writes(every, steps, start, written):
    assert checkpoints_written(every, steps, start) == written


def _simulated_peak(root: Path, keep: int, existing: int, written: int, pinned: bool) -> int:
    """The most checkpoints on disk while the real folder code writes `written` after `existing` ones."""
    for step in range(1, existing + 1):
        write_checkpoint(root, step, lambda tmp: None, {"step": step}, {}, keep=99)
    held = list_checkpoints(root)[-1:] if pinned else []
    peak = 0
    for step in range(existing + 1, existing + written + 1):
        tmp = begin_checkpoint(root, step)
        peak = max(peak, len(list_checkpoints(root)) + 1)  # the complete ones beside the one being written
        finish_checkpoint(root, step, tmp, {"step": step}, {}, keep, held)
    return peak


@pytest.mark.parametrize("keep, existing, written, pinned", [
    (2, 0, 1, False), (2, 0, 3, False), (1, 0, 4, False), (3, 0, 2, False),
    (2, 2, 1, True), (2, 2, 4, True), (1, 1, 3, True), (2, 3, 1, True), (3, 1, 5, True), (2, 1, 2, True),
])
def test_checkpoints_at_once_matches_what_the_folder_code_leaves(tmp_path, keep, existing, written, pinned):
    assert checkpoints_at_once(keep, written, existing, pinned) == _simulated_peak(tmp_path, keep, existing,
                                                                                   written, pinned)


def test_the_plan_knows_each_part_of_what_a_run_writes():
    tiny = _plan([])
    params = tiny.model.params
    d = tiny.disk
    assert (d.model_bytes, d.learner_bytes) == (4 * params, 8 * params)  # torch learner: fp32 weights, AdamW
    assert (d.checkpoints, d.at_once) == (3, 3) and d.run_dir_bytes == 3 * d.checkpoint_bytes
    assert d.build_bytes == 4 * params  # the preset is built into cache_dir in fp32
    seven = _plan(SEVEN_B).disk
    assert (seven.checkpoints, seven.at_once) == (1, 1)  # every=0: the final checkpoint, which must fit too
    assert seven.model_bytes == 2 * 7_615_616_512 and seven.learner_bytes == 14 * 7_615_616_512  # DeepSpeed
    merged = _plan(["engine=vllm", "hardware=1xh100", "model=qwen2_5_7b", "learner.lora.save_merged=true"]).disk
    assert merged.merged_bytes == 2 * 7_615_616_512 and merged.checkpoint_bytes < 2**30  # adapters only
    assert "one, at the end" in checkpoint_line(_plan(SEVEN_B))
    assert "up to 3 on disk at once" in checkpoint_line(tiny)
    assert json.loads(tiny.to_json())["disk"]["at_once"] == 3


# -- refused before the first step ----------------------------------------------------------------------------
def test_the_7b_on_a_small_disk_is_refused_before_it_starts(tmp_path):
    plan = _plan(SEVEN_B)
    [problem] = room_problems(plan, tmp_path / "run", built=True, free_bytes=_free(43_800_000_000))
    assert problem.startswith(f"{tmp_path / 'run'} has 43.8 GB free, but this run needs about 128.0 GB there: "
                              "its checkpoint at the end, about 121.8 GB (the weights 15.2 GB and the optimizer "
                              "state 106.6 GB), and 6.1 GB of headroom")
    assert problem.endswith("; free space on that disk, or point the run directory at a larger one "
                            "(hydra.run.dir=<folder>).")
    assert room_problems(plan, tmp_path / "run", built=True, free_bytes=_free(130_000_000_000)) == []


def test_a_model_still_to_build_on_the_same_disk_counts(tmp_path):
    plan = _plan([*SEVEN_B, f"cache_dir={tmp_path / 'cache'}"])
    free = needed_with_headroom(plan.disk.checkpoint_bytes, plan.disk.small_bytes)  # the checkpoint, not the build
    assert room_problems(plan, tmp_path / "run", built=True, free_bytes=_free(free)) == []
    [problem] = room_problems(plan, tmp_path / "run", built=False, free_bytes=_free(free))
    assert f"the model qwen2_5_7b built into cache_dir={tmp_path / 'cache'} (15.2 GB)" in problem
    assert problem.endswith(", or cache_dir=<a folder on another disk> to build the model there.")


def test_the_fix_names_the_checkpoint_settings_that_would_fit(tmp_path):
    plan = _plan([])  # 150 steps, a checkpoint every 50, two kept: three on disk at once
    size = plan.disk.checkpoint_bytes
    small = plan.disk.small_bytes
    [problem] = room_problems(plan, tmp_path, built=True, free_bytes=_free(needed_with_headroom(2 * size, small)))
    assert "3 checkpoints of about" in problem and "checkpoint.keep=2 stay while the next is written" in problem
    assert ", or checkpoint.keep=1 (it needs about" in problem and ", or checkpoint.every=0 (it needs about" in problem
    [problem] = room_problems(plan, tmp_path, built=True, free_bytes=_free(needed_with_headroom(size, small)))
    assert "checkpoint.keep=1" not in problem and ", or checkpoint.every=0" in problem  # keep=1 still holds two


def test_a_resumed_run_counts_its_checkpoints_and_says_how_to_resume(tmp_path):
    plan = _plan(["steps=300"])  # resumed at 150 with two kept: 200, 250 and 300 to write
    size, small = plan.disk.checkpoint_bytes, plan.disk.small_bytes
    on_disk = OnDisk((size, size), resumed_at=150)
    assert run_dir_bytes(plan, on_disk) == 2 * size  # four at once (the one it resumed from is kept): two more
    command = f"rlgen train steps=300 resume={tmp_path}"
    [problem] = room_problems(plan, tmp_path, on_disk, built=True, resume_command=command,
                              free_bytes=_free(needed_with_headroom(size, small)))
    assert "but the rest of this run needs about" in problem and "as large as the newest one there" in problem
    # with one kept, the one resumed from goes once a newer one is written: one more at once, not two
    one_more = size_text(needed_with_headroom(size, small))
    assert problem.endswith(f"; free space on that disk, or checkpoint.keep=1 (it needs about {one_more}), or "
                            f"checkpoint.every=0 (it needs about {one_more}), then resume with: {command}.")
    assert "hydra.run.dir" not in problem  # a resumed run goes on in its own directory


def test_the_validation_pass_refuses_a_new_run_on_a_small_disk(tmp_path, monkeypatch):
    monkeypatch.setattr("rlgen.plan.checks.disk_room.free_bytes_at", _free(200_000))
    report = preflight(compose_run_config([]), run_dir=tmp_path / "outputs")
    assert report.problems == [] and len(report.machine) == 1  # this machine's disk, not the config
    assert report.machine[0].startswith(f"{tmp_path / 'outputs'} has 200 KB free, but this run needs about")
    assert preflight(compose_run_config([]), run_dir=None).machine == []  # rlgen plan: no run directory to probe
    resumed = preflight(compose_run_config(["resume=auto"]), run_dir=tmp_path / "outputs")
    assert resumed.machine == []  # counted as the run starts, with the checkpoints it resumes beside


def _checkpoint(run_dir: Path, step: int, size: int) -> None:
    write_checkpoint(run_dir, step, lambda tmp: (tmp / "learner.pt").write_bytes(b"x" * size), {"step": step}, {},
                     keep=99)


def test_check_run_fits_raises_a_refusal_with_the_resume_command(tmp_path, monkeypatch):
    plan = _plan(["steps=300"])
    size, small = plan.disk.checkpoint_bytes, plan.disk.small_bytes
    for step in (100, 150):
        _checkpoint(tmp_path, step, size)
    monkeypatch.setattr("rlgen.plan.checks.disk_room.free_bytes_at", _free(needed_with_headroom(size, small)))
    with pytest.raises(DiskTooSmall) as info:
        check_run_fits(plan, tmp_path, SimpleNamespace(step=150), "rlgen train steps=300 resume=RUN")
    assert isinstance(info.value, UserError) and info.value.exit_code == 2 and len(info.value.sentences()) == 1
    assert str(info.value).endswith("then resume with: rlgen train steps=300 resume=RUN.")
    monkeypatch.setattr("rlgen.plan.checks.disk_room.free_bytes_at", _free(needed_with_headroom(3 * size, small)))
    check_run_fits(plan, tmp_path, SimpleNamespace(step=150))  # two more fit


def test_the_resume_clause_says_what_resuming_continues_from(tmp_path):
    assert resume_clause(tmp_path, "rlgen train x=1 resume=R") == ("it has no checkpoint yet, so running it again "
                                                                   "starts from step 0")
    _checkpoint(tmp_path, 4, 10)
    assert resume_clause(tmp_path, "rlgen train x=1 resume=R") == ("resume with: rlgen train x=1 resume=R (it "
                                                                   "continues from step_000004)")
    assert resume_clause(tmp_path, None) == f"resume with: resume={tmp_path} and the same settings (it continues " \
                                            "from step_000004)"


# -- the end of a run -----------------------------------------------------------------------------------------
def test_the_end_of_a_run_with_room_for_neither_checkpoint_nor_weights_says_so(tmp_path, monkeypatch):
    plan = _plan(["steps=3", "checkpoint.every=0"])
    run = SimpleNamespace(out_dir=tmp_path, plan=plan, state=SimpleNamespace(background_write=None),
                          built=SimpleNamespace(learners=[]))
    monkeypatch.setattr("rlgen.plan.checks.disk_room.free_bytes_at", _free(2 * 2**20))
    with pytest.raises(DiskFull) as info:
        save_final(run)  # nothing is asked of a learner: the probe comes first
    whole, weights = (size_text(needed_with_headroom(n, plan.disk.small_bytes))
                      for n in (plan.disk.checkpoint_bytes, plan.disk.model_bytes))
    assert str(info.value) == (f"{tmp_path / 'checkpoints'} has 2.1 MB free but a checkpoint needs about {whole} "
                               f"(the final one), and the trained weights alone about {weights}; free some space on "
                               "that disk.")
