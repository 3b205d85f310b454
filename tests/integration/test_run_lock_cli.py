"""One run per run directory, as users start them: a second `rlgen train ... resume=<dir>` while the first still
runs there is refused in one sentence naming the holder, and the first run is not disturbed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlgen.runtime.durability.status_file import read_status

TRAIN = [sys.executable, "-m", "rlgen.cli", "train", "progress=false", "algo.prompts_per_step=8"]


# make test-all only; in make test: the refusal: test_a_second_run_is_refused_before_it_writes_in_the_live_directory
@pytest.mark.long
def test_a_second_run_on_a_running_directory_is_refused_in_one_sentence(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen([*TRAIN, "steps=60", "checkpoint.every=2", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while not list(run_dir.glob("checkpoints/step_*/COMPLETE")):
            assert first.poll() is None, first.communicate()[0][-3000:]
            if time.time() > deadline:
                pytest.fail("the first run wrote no checkpoint within 180 s")
            time.sleep(0.2)
        second = subprocess.run([*TRAIN, "steps=60", "checkpoint.every=2", f"resume={run_dir}",
                                 f"hydra.run.dir={tmp_path / 'second'}"], cwd=tmp_path, capture_output=True,
                                text=True, timeout=120)
        assert first.poll() is None  # the first run goes on
        assert second.returncode == 2, second.stdout + second.stderr
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in second.stdout + second.stderr, second.stderr
        assert f"pid {first.pid}" in lines[0] and str(run_dir) in lines[0], lines[0]
        assert "running: rlgen train progress=false" in lines[0] and f"hydra.run.dir={run_dir})" in lines[0], \
            lines[0]  # the holder's own command, as it was typed
        assert read_status(run_dir)["pid"] == first.pid  # the second run did not touch the first's status
        out, _ = first.communicate(timeout=300)
        assert first.returncode == 0, out[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert read_status(run_dir)["state"] == "finished"
    assert not (Path(run_dir) / ".rlgen.lock").exists()  # released at the end


HOLD = """
import sys, time
from rlgen.runtime.durability.run_lock import acquire_run_lock
acquire_run_lock(sys.argv[1], sys.argv[2])
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_run_is_refused_before_it_writes_in_the_live_directory(tmp_path):
    run_dir = tmp_path / "run"
    hydra_dir = run_dir / ".hydra"
    hydra_dir.mkdir(parents=True)
    before = {"config.yaml": "steps: 60\n", "overrides.yaml": "- steps=60\n", "hydra.yaml": "hydra: {}\n"}
    for name, text in before.items():
        (hydra_dir / name).write_text(text)
    holder_cmd = f"rlgen train steps=60 algo.lr=3e-3 hydra.run.dir={run_dir}"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), holder_cmd], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        second = subprocess.run([*TRAIN, "steps=3", f"hydra.run.dir={run_dir}"], cwd=tmp_path, capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and f"pid {holder.pid}" in lines[0] and holder_cmd in lines[0], second.stderr
        assert "steps=3" not in lines[0]  # the holder's command, not the refused one
        assert {p.name: p.read_text() for p in hydra_dir.iterdir()} == before  # nothing of it was rewritten
        assert sorted(p.name for p in run_dir.iterdir()) == [".hydra", ".rlgen.lock"]
    finally:
        holder.kill()
        holder.wait()
