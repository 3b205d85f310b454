"""A dead or stuck actor stops the run with a clear error, and the finished steps stay on disk."""

from __future__ import annotations

import os
import sys
import time

import pytest
import ray.cloudpickle

from rlgen.config.compose import compose_run_config
from rlgen.engines.hf.engine import HFEngine
from rlgen.metrics.sink import MetricsSink, read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime import RunError, RunStopped
from rlgen.runtime.loop import train
from rlgen.runtime.setup import Hooks, set_up, tear_down

# Ray workers cannot import this test module, so its engine classes travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class DyingEngine(HFEngine):
    """Exits its process on the third generate call, as an OOM kill or a segfault would."""

    def generate(self, requests, version=None):
        if self.calls >= 2:
            os._exit(1)
        return super().generate(requests, version)


class StuckEngine(HFEngine):
    """Hangs on the second generate call."""

    def generate(self, requests, version=None):
        if self.calls >= 1:
            time.sleep(60)
        return super().generate(requests, version)


def _run(tmp_path, engine_cls, *overrides):
    cfg = compose_run_config(["progress=false", "steps=5", "algo.prompts_per_step=8", *overrides])
    run = set_up(build_plan(cfg), tmp_path, hooks=Hooks(engine_cls=engine_cls))
    try:
        sink = MetricsSink(tmp_path, cfg, cfg.steps)
        try:
            train(run, sink)
        finally:
            sink.progress.stop()
    finally:
        tear_down(run)


def test_an_engine_that_may_not_restart_stops_the_run_and_finished_steps_are_kept(tmp_path):
    # engine.max_restarts=0: the first death stops the run cleanly (tests/integration/test_durable_runs.py
    # covers restarts), with a checkpoint after the last finished step.
    with pytest.raises(RunStopped, match=r"engine0 died once, more than engine.max_restarts=0 allows") as info:
        _run(tmp_path, DyingEngine, "engine.max_restarts=0")
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1]
    assert info.value.exit_code == 1 and info.value.checkpoint.endswith("step_000002")


def test_stuck_engine_times_out(tmp_path):
    t0 = time.time()
    with pytest.raises(RunError, match=r"did not finish within timeout_s=3 s"):
        _run(tmp_path, StuckEngine, "timeout_s=3")
    assert time.time() - t0 < 55  # the run gave up on its own, long before the engine would have answered
