"""The first batch generates while the learners start: engines that hold the starting weights (fresh from the
model folder) need not wait for the learners or the weight transport (runtime.setup, Run.learners_ready)."""

from __future__ import annotations

import json
import sys
import time

import pytest
import ray.cloudpickle
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.learners.torch import TorchLearner
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime.errors import RunError
from rlgen.runtime.run import run_training

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors below, in Ray's workers
SLOW_START_S = 8.0


class SlowLearner(TorchLearner):
    def __init__(self, *args, **kwargs):
        time.sleep(SLOW_START_S)
        super().__init__(*args, **kwargs)


class LearnerThatCannotStart(TorchLearner):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("this learner cannot start")


def _cfg(*extra: str):
    return compose_run_config(["progress=false", "steps=3", *extra])


@pytest.mark.parametrize("async_steps", [0, pytest.param(1, marks=pytest.mark.long)])  # 1: make test-all only
def test_the_first_batch_does_not_wait_for_a_slow_learner(tmp_path, async_steps):
    summary = run_training(build_plan(_cfg(f"algo.async_steps={async_steps}")), tmp_path, Console(quiet=True),
                           learner_cls=SlowLearner)
    startup = json.loads((tmp_path / "summary.json").read_text())["startup"]
    engine, learner = startup["actors"]["engine0"], startup["actors"]["learner0"]
    # the engine was asked for first (its start is the longest); the learner slept and was ready only after the
    # first batch was in
    assert engine["asked_s"] <= learner["asked_s"] and learner["ready_s"] - learner["asked_s"] >= SLOW_START_S
    assert engine["ready_s"] <= startup["first_rollout_s"] < learner["ready_s"], startup
    assert "learners and weight transport (beside the first batch)" in startup["phases"]
    assert "first weight push" not in startup["phases"]
    # and the run is the same run: every step trained, every version reached the engines
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["version"] for r in records] == [1, 2, 3]
    assert max(r["staleness"] for r in records) <= async_steps
    assert abs(records[0]["mismatch/max_abs_delta"]) < 1e-3  # step 0 sampled with the learner's weights
    assert summary["startup"]["first_rollout_s"] == startup["first_rollout_s"]


def test_a_learner_that_cannot_start_is_said_in_a_sentence(tmp_path):
    with pytest.raises(RunError) as info:
        run_training(build_plan(_cfg()), tmp_path, Console(quiet=True), learner_cls=LearnerThatCannotStart)
    said = str(info.value)
    assert said.startswith("learner start-up failed") and "RuntimeError: this learner cannot start" in said
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "failed"
