"""deterministic=true on a local Ray cluster on CPU: two runs of one seed give the same per-step metrics, bit for
bit (the hf engine and the torch learner; vLLM's batch invariance is the GPU tests')."""

from __future__ import annotations

import math

import pytest

from helpers import train_or_stopped
from rlgen.metrics.sink import read_jsonl

pytestmark = pytest.mark.usefixtures("module_ray")

# how long things took, rather than what the run computed
TIMED = ("_s", "t_end", "overlap_efficiency")


def _computed(record: dict) -> dict:
    return {k: v for k, v in record.items() if isinstance(v, (int, float)) and not k.endswith(TIMED)}


def test_two_runs_of_one_seed_are_the_same_bit_for_bit(tmp_path):
    overrides = ["progress=false", "steps=4", "algo.prompts_per_step=8", "checkpoint.every=0", "deterministic=true"]
    for name in ("a", "b"):
        assert train_or_stopped(overrides, tmp_path / name) is None
    a, b = (read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("a", "b"))
    assert len(a) == len(b) == 4
    for ra, rb in zip(a, b):
        got, want = _computed(ra), _computed(rb)
        assert got and got.keys() == want.keys() and len(got) >= 20
        for key, value in got.items():
            assert value == want[key] or (math.isnan(value) and math.isnan(want[key])), (ra["step"], key)
    assert any(r["loss"] != 0 for r in a)  # it trained on something
