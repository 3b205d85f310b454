"""The bench's GPU busy sampler, against a stand-in nvidia-smi (and none at all)."""

from __future__ import annotations

import os
import time


def _three_gpus(tmp_path, monkeypatch) -> None:
    """A stand-in nvidia-smi for three GPUs, 0% busy, 40% and 80%: a line per GPU per sample, of those its -i
    names (indices, as CUDA_VISIBLE_DEVICES gives them) or all three."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\npick="0 1 2"\nfor a in "$@"; do [ "$prev" = "-i" ] && pick=$(echo "$a" | tr , " "); prev=$a; done\n'
        'if [ "$1" = "--query-gpu=index" ]; then for i in $pick; do echo $i; done; exit 0; fi\n'
        "while true; do for i in $pick; do echo $((i * 40)); done; sleep 0.02; done\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_busy_is_the_mean_over_the_given_gpus_while_started(tmp_path, monkeypatch):
    from rlgen.bench.gpu import BusySampler

    _three_gpus(tmp_path, monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    given = BusySampler()  # the process's GPU: 2, not the machine's first
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    pair = BusySampler()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    every = BusySampler()  # unset: every GPU
    try:
        assert (given.gpus, pair.gpus, every.gpus) == (1, 2, 3)
        time.sleep(0.3)  # readings before start() do not count
        for s in (given, pair, every):
            s.start()
        time.sleep(0.5)
        assert given.stop() == 80.0
        assert 58 <= pair.stop() <= 62  # the two GPUs, line by line (stop() may fall between them)
        assert 38 <= every.stop() <= 42
        time.sleep(0.2)
        assert given.stop() is None  # nothing was read since the last stop()
    finally:
        for s in (given, pair, every):
            s.close()


def test_without_nvidia_smi_busy_is_none(tmp_path, monkeypatch):
    from rlgen.bench.gpu import BusySampler

    monkeypatch.setenv("PATH", str(tmp_path))
    busy = BusySampler()
    busy.start()
    assert busy.stop() is None
    busy.close()
