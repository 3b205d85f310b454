"""The bench's GPU busy sampler, against a stand-in nvidia-smi (and none at all)."""

from __future__ import annotations

import os
import time


def _two_gpus(tmp_path, monkeypatch) -> None:
    """A stand-in nvidia-smi for two GPUs: GPU 0 always 40% busy, GPU 1 80%, a line each per sample."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\nif [ "$1" = "--query-gpu=index" ]; then echo 0; echo 1; exit 0; fi\n'
                   "while true; do echo 40; echo 80; sleep 0.02; done\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_busy_is_the_mean_of_the_readings_while_started(tmp_path, monkeypatch):
    from rlgen.bench.gpu import BusySampler

    _two_gpus(tmp_path, monkeypatch)
    busy = BusySampler()  # the bench's: the first GPU
    every = BusySampler(all_gpus=True)  # a run's: every GPU
    try:
        time.sleep(0.3)  # readings before start() do not count
        busy.start()
        every.start()
        time.sleep(0.5)
        assert busy.stop() == 40.0
        assert 58 <= every.stop() <= 62  # the two GPUs, line by line (stop() may fall between them)
        time.sleep(0.2)
        assert busy.stop() is None  # nothing was read since the last stop()
    finally:
        busy.close()
        every.close()


def test_without_nvidia_smi_busy_is_none(tmp_path, monkeypatch):
    from rlgen.bench.gpu import BusySampler

    monkeypatch.setenv("PATH", str(tmp_path))
    busy = BusySampler()
    busy.start()
    assert busy.stop() is None
    busy.close()
