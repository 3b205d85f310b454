"""One run per run directory, as users start them: a second `rlgen train ... resume=<dir>` while the first still
runs there is refused in one sentence naming the holder, and the first run is not disturbed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlgen.runtime.status import read_status

TRAIN = [sys.executable, "-m", "rlgen.cli", "train", "progress=false", "algo.prompts_per_step=8"]


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
        assert read_status(run_dir)["pid"] == first.pid  # the second run did not touch the first's status
        out, _ = first.communicate(timeout=300)
        assert first.returncode == 0, out[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert read_status(run_dir)["state"] == "finished"
    assert not (Path(run_dir) / ".rlgen.lock").exists()  # released at the end
