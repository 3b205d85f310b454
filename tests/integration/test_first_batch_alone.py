"""With algo.async_steps=1 the run's first batch generates alone: the batch of step 1 is asked for only once
step 0's is back (nothing trains before that, and a batch beside it would share the engines' decode steps and
delay the first rollout). Later batches are still asked for ahead, to generate while the learner trains
(launched before the driver waits for the step's own batch, as before this change).

A CPU run on Ray with a stand-in engine kind: the hf engine, threaded (its actor takes calls while one
generates), noting when each generate() call arrived and when it ended, by step (the step's sampling seed)."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
import ray.cloudpickle
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.engines.hf.engine import HFEngine
from rlgen.engines.registry import EngineSpec, register_engine, unregister_engine
from rlgen.plan import build_plan
from rlgen.runtime.run import run_training

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ArrivalEngine(HFEngine):
    """The hf engine, one generation at a time, noting each call's arrival and end under `marks`."""

    def __init__(self, *args, marks: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.marks, self.lock = Path(marks), threading.Lock()

    def generate(self, requests, version=None):
        arrived = time.time()
        with self.lock:
            out = super().generate(requests, version)
        step = requests[0].sampling.seed  # seed 0: each training step's sampling seed is its step
        (self.marks / f"{self.name}-{step}-{arrived:.6f}.json").write_text(
            json.dumps({"step": step, "arrived": arrived, "ended": time.time()}))
        return out


@pytest.fixture
def arrival_engine(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    register_engine(EngineSpec(kind="arrival", actor=f"{__name__}:ArrivalEngine", threaded=True,
                               actor_kwargs=lambda cfg, transport, env: {"marks": str(marks)}))
    yield marks
    unregister_engine("arrival")


def test_the_first_batch_generates_alone(arrival_engine, tmp_path):
    marks = arrival_engine
    cfg = compose_run_config(["engine.kind=arrival", "steps=4", "progress=false", "algo.async_steps=1",
                              "algo.prompts_per_step=4", "algo.samples_per_prompt=4", "checkpoint.every=0",
                              "eval.every=0", "engine.num_engines=1"])
    plan = build_plan(cfg)
    assert plan.async_steps == 1
    run_training(plan, out_dir=str(tmp_path / "run"), console=Console(quiet=True))
    calls = sorted((json.loads(p.read_text()) for p in marks.glob("*.json")), key=lambda c: c["arrived"])
    by_step = {c["step"]: c for c in calls if c["step"] is not None and 0 <= c["step"] < 4}
    assert sorted(by_step) == [0, 1, 2, 3], calls
    # step 1's batch was asked for only after step 0's had ended
    assert by_step[1]["arrived"] >= by_step[0]["ended"], by_step
