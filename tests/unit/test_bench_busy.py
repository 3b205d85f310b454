"""The bench's GPU busy sampler, against a stand-in nvidia-smi (and none at all)."""

from __future__ import annotations

import os
import time


def test_busy_is_the_mean_of_the_readings_while_started(tmp_path, monkeypatch):
    from rlgen.bench.gpu import BusySampler

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nwhile true; do echo 40; sleep 0.02; echo 80; sleep 0.02; done\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    busy = BusySampler()
    try:
        time.sleep(0.3)  # readings before start() do not count
        busy.start()
        time.sleep(0.5)
        got = busy.stop()
        assert got is not None and 50 <= got <= 70
        time.sleep(0.2)
        assert busy.stop() is None  # nothing was read since the last stop()
    finally:
        busy.close()


def test_without_nvidia_smi_busy_is_none(tmp_path, monkeypatch):
    from rlgen.bench.gpu import BusySampler

    monkeypatch.setenv("PATH", str(tmp_path))
    busy = BusySampler()
    busy.start()
    assert busy.stop() is None
    busy.close()
