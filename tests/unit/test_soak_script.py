"""benchmarks/soak.py's pure parts: the seeded fault schedule, the step-by-step comparison with the reference run,
the ballast that leaves too little room for a checkpoint, metrics.jsonl read as it grows, and the arguments it
refuses. The soak itself runs for hours and is not a test (docs/benchmarks.md, "Soak")."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from rlgen.runtime.durability.disk_space import needed_with_headroom

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak_script"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules["soak_script"]


def test_the_schedule_is_seeded_spread_and_names_every_kind(soak):
    kinds = list(soak.KINDS)
    faults = soak.fault_schedule(7, 7200, kinds, 300, 60)
    again = soak.fault_schedule(7, 7200, kinds, 300, 60)
    assert [(f.at_s, f.kind) for f in faults] == [(f.at_s, f.kind) for f in again]
    assert [(f.at_s, f.kind) for f in faults] != [(f.at_s, f.kind) for f in soak.fault_schedule(8, 7200, kinds, 300, 60)]
    times = [f.at_s for f in faults]
    assert len(faults) == round((0.9 * 7200 - 60) / 300) and times == sorted(times)
    assert 60 < times[0] and times[-1] < 0.9 * 7200
    for i in range(0, len(faults) - 3, 4):  # each round of four holds every kind once
        assert sorted(f.kind for f in faults[i:i + 4]) == sorted(kinds)


def test_a_short_soak_still_gets_every_kind_once(soak):
    faults = soak.fault_schedule(0, 120, list(soak.KINDS), 300, 30)
    assert sorted(f.kind for f in faults) == sorted(soak.KINDS)
    assert all(30 < f.at_s < 108 for f in faults)
    assert all(f.outcome == "not reached" and f.ok is None for f in faults)


def _rows(n, **change):
    rows = [{"step": i, "version": i + 1, "staleness": 1, "sequences": 64, "reward_mean": 0.1 * i,
             "reward_std": 0.3, "loss": -0.01 * i, "pg_loss": -0.01 * i, "grad_norm": 0.7, "entropy": 0.5,
             "mismatch/k3_kl": math.nan, "engine_restarts": 0} for i in range(n)]
    for (step, key), value in change.items():
        rows[step][key] = value
    return rows


def test_equal_runs_pass_and_a_difference_is_measured_per_metric(soak):
    ref = _rows(5)
    same = soak.compare(_rows(5), ref)
    assert same["passed"] and same["steps_same"] and set(same["max_abs_diff"]) == set(soak.EXACT)
    assert same["first_step_off"] is None
    assert all(d == 0.0 for d in same["max_abs_diff"].values())  # NaN against NaN counts as equal

    close = _rows(5)
    close[3]["loss"] += 5e-7
    close[2]["engine_restarts"] = 4  # not a metric resume makes exact
    verdict = soak.compare(close, ref)
    assert verdict["passed"] and 4e-7 < verdict["max_abs_diff"]["loss"] < 6e-7

    off = _rows(5)
    off[4]["grad_norm"] += 1e-3
    verdict = soak.compare(off, ref)
    assert not verdict["passed"] and verdict["max_abs_diff"]["grad_norm"] == pytest.approx(1e-3)
    assert verdict["first_step_off"] == 4


def test_missing_repeated_or_unequal_steps_fail(soak):
    ref = _rows(5)
    assert not soak.compare(_rows(4), ref)["passed"]
    twice = _rows(5)
    twice.insert(3, dict(twice[2]))
    assert not soak.compare(twice, ref)["steps_same"]
    stale = _rows(5)
    stale[1]["staleness"] = 0
    verdict = soak.compare(stale, ref)
    assert not verdict["passed"] and verdict["unequal"] == ["step 1: staleness"] and verdict["first_step_off"] == 1
    nan = _rows(5)
    nan[0]["loss"] = math.nan
    verdict = soak.compare(nan, ref)
    assert not verdict["passed"] and math.isnan(verdict["max_abs_diff"]["loss"]) and verdict["first_step_off"] == 0
    assert not soak.compare([], [])["passed"]


def test_the_ballast_leaves_less_than_the_checkpoint_check_asks_for(soak):
    free, ckpt, small = 500 * 2**20, 1_200_000, 7 * 2**20
    ballast = soak.ballast_bytes(free, ckpt, small)
    assert 0 < free - ballast < needed_with_headroom(ckpt, small)
    assert soak.ballast_bytes(4 * 2**20, ckpt, small) == 0  # already too full: nothing to add


def test_metrics_are_read_as_they_grow_and_a_cut_file_is_read_again(soak, tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = soak.MetricsTail(path)
    assert tail.poll() == 0 and tail.lines == 0
    path.write_text("".join(json.dumps({"step": i}) + "\n" for i in range(3)))
    assert tail.poll() == 0 and tail.lines == 3 and tail.last == {"step": 2}  # first sight: seen, not new
    with open(path, "a") as f:
        f.write(json.dumps({"step": 3}) + "\n" + '{"step": 4')  # the last line is not whole yet
    assert tail.poll() == 1 and tail.lines == 4 and tail.new == 1 and tail.last == {"step": 3}
    path.write_text(json.dumps({"step": 0}) + "\n")  # a resumed run kept its checkpoint's lines
    assert tail.poll() == 0 and tail.lines == 1 and tail.new == 1 and tail.last == {"step": 0}


def test_arguments_that_cannot_make_a_soak_are_refused_in_one_sentence(soak, tmp_path):
    def refused(*argv):
        args, _ = soak.parse(["out", *argv])
        return soak.refusal(args)

    assert "--run-root" in refused() and "mount -t tmpfs" in refused()
    assert refused("--faults", "engine_kill,driver_sigterm,learner_kill") is None
    assert "unknown fault kind" in refused("--faults", "engine_kill,meteor")
    assert refused("--side-by-side", "--faults", "engine_kill") is None  # open-ended reference beside --hours
    assert "is not a folder" in refused("--run-root", str(tmp_path / "none"))
    for text in (refused(), refused("--faults", "x"), refused("--run-root", str(tmp_path / "none"))):
        assert "\n" not in text


def test_an_open_ended_reference_beside_the_soak_is_stopped_once_past_the_soaks_last_step(soak, tmp_path, monkeypatch):
    args, overrides = soak.parse([str(tmp_path / "out"), "--hours", "0.01", "--side-by-side", "--faults",
                                  "engine_kill"])
    run = soak.Soak(args, overrides)
    (tmp_path / "soak.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in range(1, 6)))
    run.tail = soak.MetricsTail(tmp_path / "soak.jsonl")
    run.tail.poll()

    class Reference:  # logs one step per poll and never ends by itself
        def __init__(self):
            self.cmd = [f"steps={soak.OPEN_ENDED_STEPS}"]
            self.tail, self.steps, self.killed = soak.MetricsTail(tmp_path / "ref.jsonl"), 0, 0
            self.progress_at = float("inf")

        def poll(self):
            self.steps += 1
            with open(tmp_path / "ref.jsonl", "a") as f:
                f.write(json.dumps({"step": self.steps}) + "\n")
            self.tail.poll()
            return None

        def kill(self, run_dir):
            self.killed += 1

    monkeypatch.setattr(soak.time, "sleep", lambda s: None)
    ref = Reference()
    assert run.finish_reference(ref) is True
    assert ref.killed == 1 and ref.tail.lines == 5 and run.failures == []


def test_overrides_after_the_double_dash_come_after_the_defaults(soak):
    args, overrides = soak.parse(["out", "--hours", "0.5", "--", "engine.num_engines=1", "seed=3"])
    assert args.hours == 0.5 and overrides[-2:] == ["engine.num_engines=1", "seed=3"]
    assert overrides[: len(soak.DEFAULT_OVERRIDES)] == soak.DEFAULT_OVERRIDES
