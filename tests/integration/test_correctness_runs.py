"""The full CPU loop with injected faults: logprob drift trips the breaker (and only drift does), and a
non-finite gradient is skipped before any weights reach an engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.engines.noisy import NoisyEngine
from rlgen.metrics.sink import MetricsSink, read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime import RunError
from rlgen.runtime.loop import train
from rlgen.runtime.setup import Hooks, set_up, tear_down

BASE = ["progress=false", "algo.prompts_per_step=4", "algo.samples_per_prompt=4", "monitor.kl_threshold=0.05"]
pytestmark = pytest.mark.usefixtures("no_placement_group_left")  # the runs share one local cluster


def _spy_engine_cls():
    """An hf engine that records every weight update it receives (defined in a function, so Ray ships the
    class by value)."""
    from rlgen.engines.hf.engine import HFEngine

    class SpyEngine(HFEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.updates: list[tuple[int, bool]] = []

        def update_weights(self, weights, version):
            finite = all(bool(torch.isfinite(t).all()) for t in weights.values() if t.is_floating_point())
            self.updates.append((int(version), finite))
            return super().update_weights(weights, version)

        def health(self):
            return {**super().health(), "updates": list(self.updates)}

    return SpyEngine


def _nan_grad_learner_cls(bad_calls: set[int]):
    """The torch learner with a NaN written into one gradient on the given train_step calls."""
    from rlgen.learners.torch import TorchLearner

    class NaNGradLearner(TorchLearner):
        def _micro_backward(self, *args, **kwargs):
            out = super()._micro_backward(*args, **kwargs)
            if self.calls - 1 in bad_calls:  # calls was incremented at the start of this train_step
                with torch.no_grad():
                    self.params[0].grad.view(-1)[0] = float("nan")
            return out

    return NaNGradLearner


def _run(overrides: list[str], out: Path, **hooks) -> tuple[list[dict], str | None, list[dict]]:
    """Run the loop like `rlgen train`, with class overrides. Returns (records, halt message or None,
    the engines' health() read before the actors are torn down)."""
    cfg = compose_run_config([*BASE, *overrides])
    run = set_up(build_plan(cfg), out, hooks=Hooks(**hooks))
    error, health = None, []
    try:
        sink = MetricsSink(out, cfg, cfg.steps, Console(quiet=True))
        try:
            train(run, sink)
        except RunError as err:
            error = str(err)
        finally:
            sink.progress.stop()
        import ray

        health = ray.get([e.health.remote() for e in run.built.engines])
    finally:
        tear_down(run)
    return read_jsonl(out / "metrics.jsonl"), error, health


def test_clean_run_keeps_the_breaker_quiet(tmp_path):
    records, error, _ = _run(["steps=5", "monitor.window=2", "monitor.action=halt"], tmp_path)
    assert error is None and len(records) == 5
    assert all(r["mismatch/k3_kl"] < 1e-6 and r["mismatch/frac_over_threshold"] == 0 for r in records)
    assert all(r["monitor/trips"] == 0 and r["monitor/breach_streak"] == 0 for r in records)
    assert not (tmp_path / "breaker").exists()


def test_noisy_engine_trips_the_breaker_and_halt_archives_the_batches(tmp_path):
    records, error, _ = _run(
        ["steps=6", "monitor.window=2", "monitor.action=halt"],
        tmp_path,
        engine_cls=NoisyEngine,
        engine_kwargs={"noise_std": 0.5},
    )
    assert error is not None and "mismatch breaker tripped at step 1" in error
    assert len(records) == 2  # the tripping step is logged, then the run stops
    assert all(r["mismatch/k3_kl"] > 0.05 for r in records)  # about exp(0.5**2 / 2) - 1 = 0.13
    folder = tmp_path / "breaker" / "step_000001"
    report = json.loads((folder / "report.json").read_text())
    assert report["event"]["action"] == "halt" and [r["step"] for r in report["streak"]] == [0, 1]
    saved = torch.load(folder / "batch_000001.pt")
    assert saved["input_ids"].shape[0] == 16 and saved["engine_logprobs"].shape == saved["response_mask"].shape


def test_tighten_drops_async_steps_to_zero(tmp_path):
    records, error, _ = _run(
        ["steps=6", "monitor.window=2", "monitor.action=tighten", "algo.async_steps=1"],
        tmp_path,
        engine_cls=NoisyEngine,
        engine_kwargs={"noise_std": 0.5},
    )
    assert error is None and len(records) == 6
    assert records[1]["monitor/trips"] == 1
    assert records[1]["staleness"] == 1 or records[2]["staleness"] == 1  # off-policy before the trip
    # generation of step 2 was already under way at the trip; from step 3 on the loop is on-policy
    assert [r["staleness"] for r in records[3:]] == [0, 0, 0]


def test_nan_gradient_is_skipped_and_never_reaches_an_engine(tmp_path):
    records, error, health = _run(
        ["steps=5", "monitor.max_nonfinite_steps=3"],
        tmp_path,
        engine_cls=_spy_engine_cls(),
        learner_cls=_nan_grad_learner_cls({1, 2}),
    )
    assert error is None
    assert [r["skipped"] for r in records] == [False, True, True, False, False]
    assert "non-finite gradient" in records[1]["skip_reason"]
    assert [r["version"] for r in records] == [1, 1, 1, 2, 3]  # skipped steps apply nothing
    updates = health[0]["updates"]
    assert [v for v, _ in updates] == [1, 2, 3]  # no update was sent for a skipped step
    assert all(finite for _, finite in updates)
    assert health[0]["version"] == 3


def test_repeated_nan_gradients_halt_before_any_sync(tmp_path):
    records, error, health = _run(
        ["steps=6", "monitor.max_nonfinite_steps=2"],
        tmp_path,
        engine_cls=_spy_engine_cls(),
        learner_cls=_nan_grad_learner_cls({1, 2, 3, 4, 5}),
    )
    assert error is not None and "2 steps in a row skipped for non-finite values" in error
    assert [r["skipped"] for r in records] == [False, True, True]
    assert health[0]["updates"] == [(1, True)] and health[0]["version"] == 1
    report = json.loads((tmp_path / "breaker" / "step_000002" / "report.json").read_text())
    assert report["event"]["kind"] == "nonfinite" and [r["step"] for r in report["streak"]] == [1, 2]


def test_warn_only_reports_and_the_run_finishes(tmp_path):
    records, error, _ = _run(
        ["steps=4", "monitor.window=2", "monitor.action=warn"],
        tmp_path,
        engine_cls=NoisyEngine,
        engine_kwargs={"noise_std": 0.5},
    )
    assert error is None and len(records) == 4
    assert records[-1]["monitor/trips"] == 2 and records[-1]["version"] == 4
