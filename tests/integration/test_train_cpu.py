"""End-to-end GRPO on a local Ray cluster on CPU: the embedded default learns, on- and off-policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers import MIN_REWARD_GAIN, assert_learned
from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime.run import run_training

# What `make smoke` runs (see the Makefile)
SMOKE_OVERRIDES = ["progress=false"]


def _params_changed(initial: str, final: str) -> float:
    a = load_file(str(Path(initial) / "model.safetensors"))
    b = load_file(str(Path(final) / "model.safetensors"))
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    cfg = compose_run_config(SMOKE_OVERRIDES)
    summary = run_training(build_plan(cfg), out)
    return cfg, out, summary


@pytest.mark.slow
def test_smoke_run_learns(smoke_run):
    cfg, out, summary = smoke_run
    records = read_jsonl(out / "metrics.jsonl")
    assert len(records) == cfg.steps
    assert_learned(records, summary)
    assert _params_changed(summary["initial_model_path"], summary["model_path"]) > 1e-4
    assert records[-1]["version"] == cfg.steps  # one policy version per step, none skipped
    assert all(r["staleness"] == 0 for r in records)  # async_steps=0 is strictly on-policy
    assert json.loads((out / "plan.json").read_text())["engine_kind"] == "hf"


def _launched_ahead(records: list[dict]) -> int:
    """Steps whose next batch began generating before this step's training ended.

    One step ahead, the engines start the next batch before the learners train this one, so this holds at every
    step but the last whatever either phase's length; on-policy, a batch starts after the weights it samples from.
    """
    def span(r: dict, phase: str, edge: str, pick) -> float:
        return pick(s[edge] for s in r["timeline"] if s["phase"] == phase)

    return sum(span(nxt, "generate", "start", min) < span(r, "train", "end", max)
               for r, nxt in zip(records, records[1:]))


# make test-all only; in make test: test_one_step_ahead_generates_beside_training's short run of the same mode
@pytest.mark.long
@pytest.mark.slow
def test_async_one_step_ahead_learns(tmp_path):
    cfg = compose_run_config([*SMOKE_OVERRIDES, "algo.async_steps=1"])
    summary = run_training(build_plan(cfg), tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert max(r["staleness"] for r in records) == 1
    assert _launched_ahead(records) == len(records) - 1, "the next batch was not generated beside training"
    assert summary["reward_gain"] >= MIN_REWARD_GAIN


def test_one_step_ahead_generates_beside_training(tmp_path):
    cfg = compose_run_config([*SMOKE_OVERRIDES, "algo.async_steps=1", "steps=5"])
    run_training(build_plan(cfg), tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    # the first batch is sampled from the starting weights like the second; every later one a version behind
    assert [r["staleness"] for r in records] == [0, 1, 1, 1, 1]
    assert [r["version"] for r in records] == [1, 2, 3, 4, 5]
    assert _launched_ahead(records) == len(records) - 1, "the next batch was not generated beside training"


def test_on_policy_never_generates_ahead(tmp_path):
    cfg = compose_run_config([*SMOKE_OVERRIDES, "steps=4"])
    summary = run_training(build_plan(cfg), tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert _launched_ahead(records) == 0
    assert [r["version"] for r in records] == [1, 2, 3, 4]
    # the start-up, phase by phase, in summary.json
    startup = json.loads((tmp_path / "summary.json").read_text())["startup"]
    assert startup == summary["startup"]
    phases = startup["phases"]
    # the engine holds the starting weights, so the learner and the weight transport start beside the first batch
    learners = "learners and weight transport (beside the first batch)"
    assert list(phases) == ["launch to set-up (imports, config, plan)", "model folder", "tokenizer and task",
                            "Ray cluster", "engines and learners", learners, "first batch (generate, score)"]
    assert all(v >= 0 for v in phases.values())
    # the model folder and the task run beside Ray's start and the actors', the learners beside the first batch;
    # the other phases follow one another
    beside = ("model folder", "tokenizer and task", learners)
    in_turn = sum(v for k, v in phases.items() if k not in beside)
    assert in_turn - 0.5 <= startup["first_rollout_s"] <= sum(phases.values()) + 0.5
    for name in ("engine0", "learner0"):
        actor = startup["actors"][name]
        assert actor["steps"]["weights"] > 0 and actor["init_s"] >= actor["steps"]["weights"]
        assert actor["asked_s"] <= actor["init_begin_s"] <= actor["ready_s"]
    assert startup["actors"]["engine0"]["ready_s"] <= startup["first_rollout_s"]


# make test-all only; in make test: a sweep: test_balance_runs's test_multirun_writes_one_sweep_summary
@pytest.mark.long
def test_multirun_sweeps_async_steps(tmp_path):
    cmd = [
        sys.executable, "-m", "rlgen.cli", "train", "-m", "algo.async_steps=0,1", "steps=3", "progress=false",
        f"hydra.sweep.dir={tmp_path}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job, k in (("0", 0), ("1", 1)):
        records = read_jsonl(tmp_path / job / "metrics.jsonl")
        assert len(records) == 3
        assert max(r["staleness"] for r in records) <= k
