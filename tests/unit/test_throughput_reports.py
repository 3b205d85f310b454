"""benchmarks/peer_trl.py, benchmarks/lengths_report.py and benchmarks/restate_means.py report the mean step, the
spread of the steps and tokens/s, with ratios of means; the median only beside. Pure Python: the GPU runs
themselves are not started here."""

from __future__ import annotations

import importlib.util
import json
import sys
from itertools import accumulate
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = BENCHMARKS / "results"
ALTERNATING = [3.0, 1.0, 3.0, 1.0, 3.0, 1.0]  # mean 2, spread 3: the median says 2 here, 1 or 3 a step later


def load(name: str):
    """A benchmarks/ script as a module (registered, as its dataclasses need, under a name of its own)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def peer():
    return load("peer_trl")


@pytest.fixture(scope="module")
def lengths():
    return load("lengths_report")


@pytest.fixture(scope="module")
def restate():
    return load("restate_means")


def ends_of(steps: list[float], start: float = 100.0) -> list[float]:
    """The step ends whose differences are steps."""
    return [start, *(start + t for t in accumulate(steps))]


# -- peer_trl.py ----------------------------------------------------------------------------------------------
def test_the_steady_window_leaves_out_the_warmup_and_the_last_step(peer):
    steps = [9.0, *ALTERNATING, 9.0]  # with --warmup 2: steps[1:-1]
    f = peer.step_fields(steps, warmup=2)
    assert f["mean_step_s"] == pytest.approx(2.0)
    assert f["step_spread"] == pytest.approx(3.0)
    assert (f["step_min_s"], f["step_max_s"]) == (1.0, 3.0)
    assert f["step_cv"] == pytest.approx(0.5)
    assert f["median_step_s"] == pytest.approx(2.0)
    assert f["tokens_per_s"] is None
    assert not peer.steady_steps(steps, warmup=2).even
    assert peer.step_fields([1.0, 2.0], warmup=2) == dict.fromkeys(peer.STEP_FIELDS)


def test_summarize_reports_the_mean_spread_and_tokens_per_second(peer):
    steps = [9.0, *ALTERNATING, 9.0]
    ends = ends_of(steps)
    tokens = [50.0] * len(ends)  # one count a record; record k is step k
    r = peer.summarize("rlgen_async", 0, 90.0, ends, [0.1] * len(ends), [2.0] * len(ends), 2, {"x": 1}, tokens)
    assert r["mean_step_s"] == pytest.approx(2.0) and r["step_spread"] == pytest.approx(3.0)
    assert r["tokens_per_s"] == pytest.approx(50 * 6 / 12)
    assert r["median_step_s"] == pytest.approx(2.0)
    assert r["step_s"] == pytest.approx(steps) and r["step_tokens"] == [50.0] * len(steps)
    assert r["first_step_s"] == pytest.approx(10.0) and r["finite"] and r["x"] == 1
    unaligned = peer.summarize("trl", 0, 90.0, ends, [0.1], [2.0], 2, None, tokens[:-1])
    assert unaligned["tokens_per_s"] is None and "step_tokens" not in unaligned


def test_the_table_and_its_ratio_are_of_mean_steps(peer):
    fast = peer.summarize("rlgen_async", 0, 0.0, ends_of([9.0, *ALTERNATING, 9.0]), [0.1], [4.0], 2)
    slow = peer.summarize("trl", 0, 0.0, ends_of([9.0, 4.0, 4.0, 4.0, 9.0]), [0.1], [4.0], 2)
    assert peer.base_mean([fast, slow]) == pytest.approx(4.0)
    text = peer.table([fast, slow])
    assert "mean step s" in text and "spread (max/min)" in text and "vs base (means)" in text
    rlgen_row = next(line for line in text.splitlines() if line.startswith("| rlgen_async "))
    cells = [c.strip() for c in rlgen_row.strip("|").split("|")]
    assert cells[2:5] == ["2.000", "3.00", "0.50x"]  # mean, spread, mean over TRL's mean 4
    assert cells[6] == "2.000"  # the median, beside
    assert peer.base_mean([fast]) == pytest.approx(2.0)  # no TRL: the first side's


def test_phase_means_cover_the_records_of_the_steady_steps(peer):
    recs = [{"generate_s": g, "train_s": 1.0} for g in (50.0, 9.0, 3.0, 1.0, 40.0)]  # steady: records 2, 3
    out = peer.phase_means(recs, warmup=2)
    assert out == {"mean_generate_s": pytest.approx(2.0), "mean_train_s": pytest.approx(1.0)}
    assert not any(k.startswith("median_") for k in out)


def test_report_recomputes_the_fields_of_an_earlier_peer_json(peer, tmp_path, monkeypatch, capsys):
    old = {"warmup": 2, "spec": {}, "sides": [
        {"side": "rlgen_async", "rc": 0, "median_step_s": 3.0, "step_s": [9.0, *ALTERNATING, 9.0], "finite": True},
        {"side": "trl", "rc": 0, "median_step_s": 4.0, "step_s": [9.0, 4.0, 4.0, 9.0], "finite": True},
        {"side": "gone", "rc": 1, "median_step_s": 7.0, "finite": False}]}  # no step_s: kept as it is
    (tmp_path / "peer.json").write_text(json.dumps(old))
    monkeypatch.setattr(sys, "argv", ["peer_trl.py", "--report", str(tmp_path)])
    peer.main()
    new = json.loads((tmp_path / "peer.json").read_text())["sides"]
    assert new[0]["mean_step_s"] == pytest.approx(2.0) and new[0]["median_step_s"] == pytest.approx(2.0)
    assert new[0]["step_spread"] == pytest.approx(3.0)
    assert new[1]["mean_step_s"] == pytest.approx(4.0)
    assert new[2] == old["sides"][2]
    assert "0.50x" in capsys.readouterr().out


def test_a_recorded_report_is_retabled_with_the_medians_it_recorded(peer):
    rec = json.loads((RESULTS / "2026-11-28-h200-packed-learner.json").read_text())["tail_peer_rl"]
    recorded = [s["median_step_s"] for s in rec["sides"]]
    sides = peer.retable(json.loads(json.dumps(rec)))["sides"]
    assert [s["median_step_s"] for s in sides] == pytest.approx(recorded, abs=1e-4)  # step_s kept to 4 places
    rlgen = sides[0]
    assert rlgen["mean_step_s"] == pytest.approx(sum(rlgen["step_s"][1:-1]) / 7)
    assert rlgen["step_spread"] == pytest.approx(max(rlgen["step_s"][1:-1]) / min(rlgen["step_s"][1:-1]))


# -- lengths_report.py ----------------------------------------------------------------------------------------
def write_run(root: Path, name: str, steps: list[float], tokens: float = 600.0) -> Path:
    run = root / name
    run.mkdir()
    recs = [{"step": i, "step_s": s, "train_s": s / 2, "generate_s": 1.0, "response_tokens": tokens,
             "sequences": 4} for i, s in enumerate(steps)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    plan = {"config": {"algo": {"max_new_tokens": 256, "micro_batch_tokens": 4096},
                       "learner": {"attention": "sdpa"}}, "memory": {}}
    (run / "plan.json").write_text(json.dumps(plan))
    return run


def test_a_run_reports_means_spread_and_tokens_per_second(lengths, tmp_path):
    row = lengths.run_summary(write_run(tmp_path, "alt", [10.0, *ALTERNATING]))  # steps 1..: ALTERNATING
    assert row["step_s"] == pytest.approx(2.0) and row["train_s"] == pytest.approx(1.0)
    assert row["step_spread"] == pytest.approx(3.0) and row["steps_even"] is False
    assert (row["step_min_s"], row["step_max_s"]) == (1.0, 3.0)
    assert row["tokens_per_s"] == pytest.approx(600 * 6 / 12)
    assert row["step_s_median"] == pytest.approx(2.0)
    assert row["mean_response_tokens"] == pytest.approx(150.0)


def test_the_steady_steps_leave_out_the_first_two_and_the_last(lengths, tmp_path):
    # step 1 waits for the batch launched once step 0's was in; the last trains with nothing generating beside it
    row = lengths.run_summary(write_run(tmp_path, "ends", [10.0, 7.0, 4.0, 4.0, 4.0, 1.5]))
    assert row["step_s"] == pytest.approx(4.0) and row["step_spread"] == pytest.approx(1.0)
    assert row["train_s"] == pytest.approx(2.0)  # the phases' means over the same steps


def test_one_step_runs_count_their_one_step(lengths, tmp_path):
    row = lengths.run_summary(write_run(tmp_path, "one", [5.0]))
    assert row["step_s"] == 5.0 and row["step_spread"] == 1.0 and row["tokens_per_s"] == pytest.approx(120.0)


def test_the_mismatch_by_length_is_weighted_by_each_steps_tokens(lengths):
    key = "mismatch/by_length/32k+/"
    steps = [{key + "tokens": 100, key + "k3_kl": 1e-3, key + "mean_abs_delta": 0.1, key + "max_abs_delta": 0.5},
             {key + "tokens": 300, key + "k3_kl": 3e-3, key + "mean_abs_delta": 0.3, key + "max_abs_delta": 0.2},
             {"step": 2}]  # a step with no row that long
    got = lengths.mismatch_by_length(steps)
    assert got["mismatch_32k+_k3_kl"] == pytest.approx(2.5e-3) and got["mismatch_32k+_mean_abs_delta"] == pytest.approx(0.25)
    assert got["mismatch_32k+_max_abs_delta"] == 0.5 and got["mismatch_32k+_tokens"] == 400
    assert lengths.mismatch_by_length([{"step": 0}]) == {}


def test_ratios_to_the_base_run_are_of_means_and_the_table_shows_them(lengths, tmp_path):
    base = write_run(tmp_path, "even", [10.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0])
    alt = write_run(tmp_path, "alt", [10.0, *ALTERNATING])
    rep = lengths.report([base, alt])
    row = rep["runs"][1]
    assert row["step_s_vs_even"] == pytest.approx(0.5)  # means 2 over 4; the medians would give 0.5 here, 0.25
    assert row["tokens_per_s_vs_even"] == pytest.approx(2.0)
    text = lengths.table(rep)
    header = text.splitlines()[0]
    for col in ("step_s", "step_spread", "tokens_per_s", "step_s_median", "step_s_vs_even"):
        assert f" {col} " in header


# -- restate_means.py -----------------------------------------------------------------------------------------
def test_restate_gives_the_ratio_of_means_beside_the_recorded_median_ratio(restate):
    doc = {"peer": {"warmup": 2, "sides": [
        {"side": "rlgen_async", "median_step_s": 3.0, "step_s": [9.0, *ALTERNATING, 9.0]},
        {"side": "trl", "median_step_s": 4.0, "step_s": [9.0, 4.0, 4.0, 9.0]}]}}
    lines = restate.restate(doc)
    row = next(line for line in lines if "| rlgen_async |" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:9] == ["3.000", "2.000", "2.000", "1.000", "3.000", "3.00"]  # recorded, again, mean, min, max
    assert cells[-5:] == ["trl", "0.75x", "0.50x", "1.33x", "2.00x"]  # and TRL's step over rlgen's


def test_restate_says_where_a_file_lacks_per_step_data(restate):
    doc = {"tail": {"peer_trl_rl": [{"side": "rlgen_async", "median_step_s": 3.0}, {"side": "trl"}]},
           "padding": {"runs": [{"run": "pad-fixed", "step_s": 4.5}, {"run": "pad-rl", "step_s": 7.8}]}}
    lines = restate.restate(doc)
    assert not any(line.startswith("|") for line in lines)
    assert any("/tail/peer_trl_rl" in line and "no per-step data" in line for line in lines)
    assert any("/padding" in line and "no per-step data" in line for line in lines)


def test_restate_compares_one_side_across_reports_and_runs_by_their_records(restate):
    doc = {"fixed": {"warmup": 2, "sides": [{"side": "rlgen_async", "step_s": [9.0, 2.0, 2.0, 9.0]}]},
           "rl": {"warmup": 2, "sides": [{"side": "rlgen_async", "step_s": [9.0, *ALTERNATING, 9.0]}]},
           "runs": {"a": {"per_step": [{"step": i, "step_s": s} for i, s in enumerate([9.0, 4.0, 4.0])]},
                    "b": {"per_step": [{"step": i, "step_s": s} for i, s in enumerate([9.0, *ALTERNATING])]}}}
    lines = restate.restate(doc)
    across = next(line for line in lines if line.startswith("| /rl | rlgen_async |") and "/fixed" in line)
    assert [c.strip() for c in across.strip("|").split("|")][-3] == "1.00x"  # mean 2 over mean 2
    run_b = next(line for line in lines if line.startswith("| /runs | b |"))
    assert [c.strip() for c in run_b.strip("|").split("|")][-3] == "0.50x"  # mean 2 over run a's mean 4
