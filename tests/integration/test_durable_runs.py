"""Runs that survive, on a local Ray cluster on CPU: a run stopped at any step and resumed is exactly the run
that was never stopped; a dead engine is re-created and its prompts scored once; a dead learner or an engine
that keeps dying stops the run cleanly at a checkpoint that resume continues."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import ray
import ray.cloudpickle
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.engines.hf.engine import HFEngine
from rlgen.learners.torch import TorchLearner
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime import RunStopped
from rlgen.runtime.checkpoint_dir import list_checkpoints
from rlgen.runtime.resume import identity, resolve_explicit
from rlgen.runtime.run import run_training
from rlgen.runtime.status import read_status
from rlgen.runtime.stop import StopFlag

# Ray workers cannot import this test module, so its actor classes travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

BASE = ["progress=false", "algo.prompts_per_step=8", "checkpoint.every=0"]
EXACT = ("reward_mean", "reward_std", "loss", "pg_loss", "grad_norm", "entropy", "mismatch/k3_kl")


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """One local cluster for the module's runs (a run leaves a cluster it did not start running)."""
    ray.init(address="local", num_cpus=4, include_dashboard=False, object_store_memory=512 * 2**20)
    yield
    ray.shutdown()


class StopAtStep(StopFlag):
    """A stop request that arrives once `step` steps are logged, as Ctrl-C at that moment would."""

    def __init__(self, step: int, out: Path):
        super().__init__()
        self.at, self.metrics, self.signum = step, out / "metrics.jsonl", signal.SIGINT

    @property
    def requested(self) -> bool:
        return self.metrics.is_file() and len(self.metrics.read_text().splitlines()) >= self.at


class DiesOnce(HFEngine):
    """Exits its process (as an OOM kill would) on its `at`-th generate call, once per marker file."""

    def __init__(self, *args, marker: str, at: int = 3, **kwargs):
        super().__init__(*args, **kwargs)
        self.marker, self.at = marker, at

    def generate(self, requests, version=None):
        if self.calls + 1 >= self.at and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(self.calls))
            os._exit(1)
        return super().generate(requests, version)


class AlwaysDies(HFEngine):
    """Every incarnation dies on its second generate call."""

    def generate(self, requests, version=None):
        if self.calls >= 1:
            os._exit(1)
        return super().generate(requests, version)


def _learner_dying_at(call: int, marker: str) -> type:
    class LearnerDiesOnce(TorchLearner):
        def train_step(self, batch):
            if self.calls == call and not os.path.exists(marker):
                Path(marker).write_text("died")
                os._exit(1)
            return super().train_step(batch)

    return LearnerDiesOnce


def _run(out: Path, overrides: list[str], *, stop=None, resume: bool = False, **kwargs) -> RunStopped | None:
    cfg = compose_run_config([*BASE, *overrides])
    plan = build_plan(cfg)
    point = resolve_explicit(str(out), identity(plan.config, len(plan.learners))) if resume else None
    try:
        run_training(plan, out, Console(quiet=True), resume=point, stop=stop, **kwargs)
    except RunStopped as err:
        return err
    return None


def _assert_same_steps(records: list[dict], reference: list[dict]) -> None:
    assert [r["step"] for r in records] == [r["step"] for r in reference], "a step is missing or logged twice"
    for r, ref in zip(records, reference):
        for key in EXACT:
            assert abs(float(r[key]) - float(ref[key])) <= 1e-6, f"step {r['step']}: {key} {r[key]} != {ref[key]}"
        assert r["version"] == ref["version"] and r["staleness"] == ref["staleness"]


@pytest.mark.parametrize("async_steps", [0, 1])
def test_stopped_and_resumed_twice_equals_the_uninterrupted_run(tmp_path, async_steps):
    overrides = ["steps=9", f"algo.async_steps={async_steps}"]
    assert _run(tmp_path / "whole", overrides) is None
    reference = read_jsonl(tmp_path / "whole" / "metrics.jsonl")
    assert len(reference) == 9

    out = tmp_path / "stopped"
    for stop_at in (3, 6):  # stop, resume and stop again, then resume to the end
        err = _run(out, overrides, stop=StopAtStep(stop_at, out), resume=stop_at != 3)
        assert err is not None and err.step == stop_at and err.exit_code == 130
        assert Path(err.checkpoint).name == f"step_{stop_at:06d}"
        status = read_status(out)
        assert status["state"] == "stopped" and status["step"] == stop_at and status["checkpoint"] == err.checkpoint
    assert _run(out, overrides, resume=True) is None
    _assert_same_steps(read_jsonl(out / "metrics.jsonl"), reference)
    assert read_status(out)["state"] == "finished"
    if async_steps:  # the stop kept the rollouts generated ahead, and the resumed run trained on them
        assert max(r["staleness"] for r in reference) == 1


def test_a_dead_engine_is_recreated_and_the_run_is_unchanged(tmp_path):
    overrides = ["steps=6"]
    assert _run(tmp_path / "whole", overrides) is None
    reference = read_jsonl(tmp_path / "whole" / "metrics.jsonl")

    marker = tmp_path / "engine-died"
    out = tmp_path / "faulty"
    assert _run(out, overrides, engine_cls=DiesOnce, engine_kwargs={"marker": str(marker), "at": 3}) is None
    assert marker.read_text() == "2"  # it died during the third step's generation
    records = read_jsonl(out / "metrics.jsonl")
    # The re-created engine got the current weights and the same requests with the same seeds: every prompt
    # was scored exactly once (the loop checks each step), and the rollouts are the ones it would have made.
    _assert_same_steps(records, reference)
    assert [r["engine_restarts"] for r in records] == [0, 0, 1, 1, 1, 1]
    assert all(r["sequences"] == 8 * 8 for r in records)


def test_an_engine_that_keeps_dying_stops_the_run_cleanly_and_resume_finishes_it(tmp_path):
    err = _run(tmp_path, ["steps=6", "engine.max_restarts=1"], engine_cls=AlwaysDies)
    assert err is not None and err.exit_code == 1
    assert "engine0 died 2 times, more than engine.max_restarts=1" in str(err)
    assert err.checkpoint is not None and Path(err.checkpoint).name == f"step_{err.step:06d}"
    assert read_status(tmp_path)["state"] == "stopped"
    assert _run(tmp_path, ["steps=6"], resume=True) is None
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(6))


def test_a_dead_learner_stops_the_run_and_resume_continues_from_the_last_checkpoint(tmp_path):
    marker = str(tmp_path / "learner-died")
    err = _run(tmp_path, ["steps=8", "checkpoint.every=2"], learner_cls=_learner_dying_at(5, marker))
    assert err is not None and err.exit_code == 1 and "a learner died" in str(err)
    assert err.checkpoint is not None and Path(err.checkpoint).name == "step_000004"
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 5  # step 4 ran but is redone from the checkpoint
    assert _run(tmp_path, ["steps=8", "checkpoint.every=2"], resume=True) is None
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(8))
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000006", "step_000008"]  # checkpoint.keep=2


def test_a_torn_checkpoint_is_skipped_on_resume(tmp_path):
    assert _run(tmp_path, ["steps=6", "checkpoint.every=3", "checkpoint.keep=3"]) is None
    newest = list_checkpoints(tmp_path)[-1]
    assert newest.name == "step_000006"
    (newest / "COMPLETE").unlink()  # as if the process died while writing it
    assert _run(tmp_path, ["steps=8", "checkpoint.every=3", "checkpoint.keep=3"], resume=True) is None
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(8))
    resumes = (tmp_path / "resumes.jsonl").read_text()
    assert '"step": 3' in resumes  # it went back to step 3, the newest complete checkpoint
