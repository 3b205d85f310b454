"""A disk too small for a run, as a user meets it from the command line, in a fresh process: `rlgen train` on the
CPU default refuses in one sentence before Ray starts or anything is written; a run whose disk filled while it
trained ends well, with the trained weights in final_model and a note saying the optimizer state was not kept.
The child process reports a stand-in free space, as a small disk would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.plan.checks.disk_room import needed_with_headroom
from rlgen.runtime.durability.checkpoint_folder import list_checkpoints
from rlgen.runtime.durability.status_file import read_status

# rlgen's command line, with the disk reporting `free` bytes once `after` metrics lines are written (10**12 before)
SMALL_DISK = """
import sys
from pathlib import Path
import rlgen.plan.checks.disk_room as room
free, after, metrics = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
def probe(path):
    lines = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    return 10**12 if lines < after else free
room.free_bytes_at = probe
from rlgen.cli import main
sys.exit(main(sys.argv[4:]))
"""


def _train(run_dir: Path, free: int, after: int, *overrides: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", SMALL_DISK, str(free), str(after), str(run_dir / "metrics.jsonl"),
                           "train", "progress=false", f"hydra.run.dir={run_dir}", *overrides],
                          cwd=run_dir.parent, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "400"})
    return proc, time.perf_counter() - t0


def test_a_disk_too_small_for_the_run_is_refused_before_anything_starts(tmp_path):
    run_dir = tmp_path / "run"
    proc, wall = _train(run_dir, 200_000, 0)  # 200 KB free
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out, out[-3000:]
    assert lines[0].startswith(f"error: {run_dir} has 200 KB free, but this run needs about ")
    assert "hydra.run.dir=<folder>" in lines[0]
    assert "Started a local Ray instance" not in out and wall < 60, wall  # before Ray, within seconds
    assert not run_dir.exists()  # nothing written: no lock, no .hydra, no status


def test_a_run_whose_disk_filled_keeps_its_trained_weights_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    disk = build_plan(compose_run_config(["steps=3", "checkpoint.every=0"])).disk
    between = needed_with_headroom(disk.model_bytes, disk.small_bytes) + disk.learner_bytes // 2  # weights, not more
    proc, _ = _train(run_dir, between, 3, "steps=3", "checkpoint.every=0")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    final = run_dir / "final_model"
    assert "note: the final checkpoint did not fit" in proc.stdout and f"saved in {final}" in proc.stdout, out[-3000:]
    assert (final / "model.safetensors").is_file() and (final / "tokenizer_config.json").is_file()
    assert not list_checkpoints(run_dir)
    status = read_status(run_dir)
    assert status["state"] == "finished" and "without the optimizer state" in status["note"]
