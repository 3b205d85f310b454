"""What `rlgen train` prints, as a user runs it: no warning the run itself causes (Ray's notice that it turned
token authentication on for the local cluster), and an ending that fits one screen, with no JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_a_default_run_prints_no_token_warning_and_ends_on_one_screen(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}  # as on a fresh machine
    proc = subprocess.run([sys.executable, "-m", "rlgen.cli", "train", "steps=3", "progress=false",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both[-3000:]
    assert "Token authentication" not in both and "RAY_AUTH_MODE" not in both, both[-3000:]
    lines = proc.stdout.splitlines()
    ending = lines[next(i for i, line in enumerate(lines) if line.startswith("run summary")):]
    assert len(ending) <= 45, proc.stdout  # run summary, balance and advice, start-up, time to first rollout
    assert not any(line.lstrip().startswith("{") for line in lines), proc.stdout  # summary.json holds the JSON
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 3
