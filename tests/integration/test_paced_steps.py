"""Generation-bound steps with algo.async_steps=1 do not alternate (rlgen.runtime.rollouts.pace).

A CPU run on Ray with a stand-in engine kind whose every generate() call takes the same wall time D from its
arrival, however many calls run beside it (as a decode that latency bounds does): so generation, not training,
bounds each step. Launched at each step's start, the flights ahead form two chains that the first steps set a
training phase apart, and steps alternate between about D and the training phase. Paced, they are even, at the
same mean."""

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
from rlgen.metrics.steady import steady
from rlgen.plan import build_plan
from rlgen.runtime.rollouts import pace
from rlgen.runtime.run import run_training

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

GEN_S = 3.0  # every generate() call's wall time: long beside a CPU step of the tiny model, even on a loaded machine
STEPS = 9


class FixedTimeEngine(HFEngine):
    """The hf engine, its generate() calls answering GEN_S after they arrive, their spans to match."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()

    def generate(self, requests, version=None):
        arrived = time.time()
        with self.lock:
            out = super().generate(requests, version)
        time.sleep(max(0.0, arrived + GEN_S - time.time()))
        end = time.time()  # the generate span ends when the call answers, as a real decode's does
        out.spans = [(phase, a, end if phase == "generate" else b) for phase, a, b in out.spans]
        return out


@pytest.fixture
def fixed_time_engine():
    register_engine(EngineSpec(kind="fixed_time", actor=f"{__name__}:FixedTimeEngine", threaded=True))
    yield
    unregister_engine("fixed_time")


def _steps(tmp_path: Path, name: str, *extra: str) -> tuple[list[float], list[dict]]:
    cfg = compose_run_config(["engine.kind=fixed_time", f"steps={STEPS}", "progress=false", "algo.async_steps=1",
                              "algo.prompts_per_step=4", "algo.samples_per_prompt=4", "checkpoint.every=0",
                              "eval.every=0", "engine.num_engines=1", *extra])
    plan = build_plan(cfg)
    assert plan.async_steps == 1
    run_training(plan, out_dir=str(tmp_path / name), console=Console(quiet=True))
    recs = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    ends = [r["t_end"] for r in recs]
    return [b - a for a, b in zip(ends, ends[1:])], recs  # step k (k >= 1): end of k-1 to end of k


def test_paced_steps_do_not_alternate(fixed_time_engine, tmp_path, monkeypatch):
    paced, recs = _steps(tmp_path, "paced")
    with monkeypatch.context() as m:
        m.setattr(pace, "PACE_SHARE", 0.0)  # every flight ahead goes out when its step begins, as before the pace
        unpaced, _ = _steps(tmp_path, "unpaced")
    # steady: from step 2 (step 1 waits for the batch launched only once step 0's was in), the last one left out
    before, after = steady(unpaced, warmup=1, tail=1), steady(paced, warmup=1, tail=1)
    assert before is not None and after is not None
    assert before.spread > 2.0, unpaced  # the stand-in alternates without the pace: the test can see it
    assert after.spread <= 1.5, (paced, unpaced)
    assert after.mean_s <= 1.1 * before.mean_s, (paced, unpaced)  # even steps at the same throughput
    held = [r.get("gen/launch_ahead_s", 0.0) for r in recs[1:-1]]
    assert max(held) > 0.2, held  # the pace held a flight back after its step began (step 1: the first chance)


def test_own_in_sends_the_flight_ahead_once_the_steps_own_is_in(fixed_time_engine, tmp_path):
    steps, recs = _steps(tmp_path, "own_in", "algo.launch_ahead=own_in")
    after = steady(steps, warmup=1, tail=1)
    assert after is not None and after.spread <= 1.5, steps
    # one flight generates at a time: a step takes a flight's whole generate call (its learner work is far shorter)
    assert after.mean_s >= 0.9 * GEN_S, steps
    held = [r["gen/launch_ahead_s"] for r in recs[1:-1]]
    assert min(held) >= 0.5 * GEN_S, held  # each went out once the step's own call had answered
