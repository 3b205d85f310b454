"""`rlgen train ray.address=auto` joins a cluster started with `ray start --head`, as the cluster docs describe
(one machine is enough), and leaves that cluster running when it ends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlgen.metrics.sink import read_jsonl


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# make test-all only; in make test: joining a cluster: test_ray_token_cluster's join, which also needs the token
@pytest.mark.long
def test_train_joins_a_cluster_started_with_ray_start(tmp_path):
    ray_cli = str(Path(sys.executable).with_name("ray"))
    short = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    env = {**os.environ, "RAY_TMPDIR": str(short)}
    env.pop("RAY_ADDRESS", None)
    port = _free_port()
    # --block keeps the head in the foreground; signalling its process group stops every Ray process it started.
    head = subprocess.Popen([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=3", "--block",
                             "--include-dashboard=false", "--disable-usage-stats"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        current = short / "ray" / "ray_current_cluster"
        deadline = time.time() + 90
        while not current.is_file() and time.time() < deadline:
            assert head.poll() is None, head.communicate()[0][-3000:]
            time.sleep(0.5)
        assert current.is_file(), "ray start --head did not come up"
        proc = subprocess.run(
            [sys.executable, "-m", "rlgen.cli", "train", "ray.address=auto", "steps=3", "progress=false",
             "algo.prompts_per_step=8", f"hydra.run.dir={tmp_path / 'run'}"],
            env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Connected to Ray cluster" in proc.stderr + proc.stdout  # joined it rather than starting one
        assert len(read_jsonl(tmp_path / "run" / "metrics.jsonl")) == 3
        assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "finished"
        assert head.poll() is None, "the run took down the cluster it joined"
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(short, ignore_errors=True)
