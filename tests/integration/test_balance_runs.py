"""Real CPU runs: the verdict follows the bottleneck, and a 2-run multirun writes one sweep summary.

Two configs put the bottleneck on opposite sides of the loop:
- starved learner: engine.max_num_seqs=2 makes the hf engine generate 2 sequences at a time, so a step's 128
  sequences take ~60 generate calls while the learner trains in one pass: generation-bound;
- slow learner: algo.micro_batch_tokens=12 (the longest row: 8 prompt + 4 response tokens) makes the learner run
  a forward/backward pass for about every row of a step while the engine generates the batch in one call:
  training-bound.
On 2 cores each side is 10x or more the other, far outside the balancer's +-15% dead band.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.metrics.balance import BalanceTracker, Kind, summarize
from rlgen.metrics.report import load_run, write_report
from rlgen.plan import build_plan
from rlgen.runtime.run import run_training

BASE = ["progress=false", "steps=8"]
STARVED_LEARNER = [*BASE, "engine.max_num_seqs=2"]
SLOW_LEARNER = [*BASE, "algo.micro_batch_tokens=12"]


def _verdicts(out_dir):
    records, ctx = load_run(out_dir)
    tracker = BalanceTracker(ctx)
    rolling = [tracker.update(r) for r in records]
    return records, ctx, rolling, summarize(records, ctx)


# make test-all only; in make test: the verdicts: tests/unit/test_balancer.py; a run's report:
# test_multirun_writes_one_sweep_summary
@pytest.mark.long
@pytest.mark.slow
def test_verdict_follows_the_bottleneck(tmp_path):
    kinds = {}
    for name, overrides in (("starved", STARVED_LEARNER), ("slow", SLOW_LEARNER)):
        out = tmp_path / name
        run_training(build_plan(compose_run_config(overrides)), out)
        records, ctx, rolling, overall = _verdicts(out)
        assert len(records) == 8
        kinds[name] = (overall, rolling[-1])
        paths = write_report(out, records, ctx)
        assert paths["timeline"].stat().st_size > 5_000

    starved, starved_last = kinds["starved"]
    assert starved.kind == starved_last.kind == Kind.generation_bound.value, starved.advice
    assert starved.learner_wait_frac > 0.5
    assert "add " in starved.advice and " engine" in starved.advice

    slow, slow_last = kinds["slow"]
    assert slow.kind == slow_last.kind == Kind.training_bound.value, slow.advice
    assert slow.engine_idle_frac > 0.5
    assert "async_steps" not in slow.advice  # CPU runs stay on-policy: no advice to run engines ahead


@pytest.mark.slow
def test_multirun_writes_one_sweep_summary(tmp_path):
    """Two runs, plus a third point the plan rejects: the sweep goes on, the summary says why, and the sweep exits 2."""
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable, "-m", "rlgen.cli", "train", "-m", "engine.num_engines=1,0,2", "steps=5", "progress=false",
        f"hydra.sweep.dir={sweep}", "++hydra.callbacks.sweep_summary._target_=rlgen.commands.sweep.SweepSummary",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]  # the others ran; the refused one counts
    assert "1 of 3 sweep points did not run to the end: engine.num_engines=0 (rejected" in " ".join(proc.stderr.split())
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    runs = summary["runs"]
    rejected = [r for r in runs if r["status"] == "rejected"]
    assert [r["overrides"][0] for r in rejected] == ["engine.num_engines=0"]
    assert "must be at least 1" in rejected[0]["reason"]
    runs = [r for r in runs if r not in rejected]
    assert sorted(r["overrides"][0] for r in runs) == ["engine.num_engines=1", "engine.num_engines=2"]
    assert all(r["status"] == "ok" and r["kind"] in {k.value for k in Kind} for r in runs)
    assert sorted(r["num_engines"] for r in runs) == [1, 2]
    throughputs = [r["tokens_per_s_end_to_end"] for r in runs]
    assert all(t > 0 for t in throughputs) and throughputs[0] > throughputs[1]  # ranked, and they differ
    # a later job's time to its first rollout counts from its own start, not from the sweep's launch
    later = json.loads((sweep / "2" / "summary.json").read_text())
    launch = later["startup"]["phases"]["launch to set-up (imports, config, plan)"]
    assert 0 < later["first_rollout_s"] < later["setup_s"] + later["wall_s"] and launch < 5.0, later["startup"]
    md = (sweep / "sweep_summary.md").read_text()
    assert "engine.num_engines=1" in md and "engine.num_engines=2" in md and "## Advice" in md
    assert "## Runs that did not finish" in md and "engine.num_engines=0" in md
