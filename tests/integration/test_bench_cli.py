"""`rlgen bench` on a machine without a CUDA GPU: one sentence saying so, exit 2, no traceback or Hydra text."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_bench_without_a_gpu_says_so_in_one_sentence(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rlgen.cli", "bench", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    both = proc.stdout + proc.stderr
    assert proc.returncode == 2, both
    assert "error: rlgen bench needs a CUDA GPU" in proc.stderr, both
    assert "run it on a GPU machine" in proc.stderr, both  # the fix, in the same sentence
    assert "Traceback" not in both and "Error executing job" not in both, both
