"""The learning comparison of benchmarks/peer_trl.py (--learn): smoothing, time to a target reward, the ratio of
the two sides' times, non-finite detection, and reading each side's per-step records. The script runs TRL and
vLLM only on a GPU host; these parts are pure Python."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peer_trl.py"


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("peer_trl", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def curve(seconds: list[float], rewards: list[float]) -> list[dict]:
    return [{"step": i + 1, "seconds": s, "reward": r} for i, (s, r) in enumerate(zip(seconds, rewards))]


# TRL: slow to start, slow steps; rlgen: later first step, faster steps. Rewards are exact in binary.
TRL = curve([10.0, 20.0, 30.0, 40.0, 50.0], [0.0, 0.25, 0.5, 0.5, 0.75])  # means of 2: .125 .375 .5 .625
RLGEN = curve([30.0, 32.0, 34.0, 36.0, 38.0], [0.25, 0.75, 0.5, 1.0, 0.5])  # means of 2: .5 .625 .75 .75


def test_smooth_is_a_trailing_mean_from_the_first_full_window(peer):
    assert peer.smooth([0.0, 0.5, 1.0, 0.5], 2) == [None, 0.25, 0.75, 0.75]
    assert peer.smooth([0.0, 0.5, 1.0, 0.5], 1) == [0.0, 0.5, 1.0, 0.5]
    assert peer.smooth([1.0, 0.0, 0.5], 10) == [None, None, 0.5]  # shorter than the window: one mean of all
    assert peer.smooth([], 10) == []


def test_smoothed_leaves_out_non_finite_rewards_first(peer):
    points = curve([1.0, 2.0, 3.0, 4.0], [0.5, math.nan, 1.0, 0.0])
    assert peer.smoothed(points, 2) == [{"step": 3, "seconds": 3.0, "reward": 0.75},
                                        {"step": 4, "seconds": 4.0, "reward": 0.5}]


def test_first_at_finds_the_first_smoothed_point_at_or_over_the_target(peer):
    smooth = peer.smoothed(TRL, 2)
    assert peer.first_at(smooth, 0.5) == {"step": 4, "seconds": 40.0, "reward": 0.5}
    assert peer.first_at(smooth, 0.125) == {"step": 2, "seconds": 20.0, "reward": 0.125}
    assert peer.first_at(smooth, 0.7) is None


def test_first_nonfinite(peer):
    rows = [{"step": 1, "loss": 0.5, "reward": 0.25, "grad_norm": None},
            {"step": 2, "loss": 0.25, "reward": 0.5, "grad_norm": math.inf},
            {"step": 3, "loss": math.nan}]
    assert peer.first_nonfinite(rows) == {"step": 2, "key": "grad_norm", "value": "inf"}
    assert peer.first_nonfinite(rows[2:]) == {"step": 3, "key": "loss", "value": "nan"}
    assert peer.first_nonfinite(rows[:1]) is None
    assert peer.first_nonfinite([]) is None


def test_summary_times_both_sides_to_the_best_reward_both_reach(peer):
    s = peer.learning_summary({"rlgen": {"points": RLGEN, "nonfinite": None},
                               "trl": {"points": TRL, "nonfinite": None}}, window=2)
    assert s["target"] == 0.625 and s["every_side_reaches"] == 0.625 and not s["target_given"]
    assert s["sides"]["trl"] == {"steps": 5, "launch_to_first_step_s": 10.0, "final_reward": 0.625,
                                 "best_reward": 0.625, "target_step": 5, "target_s": 50.0,
                                 "target_s_after_first_step": 40.0, "nonfinite": None}
    rl = s["sides"]["rlgen"]
    assert (rl["final_reward"], rl["best_reward"]) == (0.75, 0.75)
    assert (rl["target_step"], rl["target_s"], rl["target_s_after_first_step"]) == (3, 34.0, 4.0)
    assert rl["ratio"] == 34.0 / 50.0 == s["ratio"]
    assert rl["ratio_after_first_step"] == 4.0 / 40.0
    assert "ratio" not in s["sides"]["trl"]


def test_summary_with_a_given_target(peer):
    s = peer.learning_summary({"rlgen": {"points": RLGEN}, "trl": {"points": TRL}}, window=2, target=0.5)
    assert s["target"] == 0.5 and s["target_given"] and s["every_side_reaches"] == 0.625
    assert (s["sides"]["rlgen"]["target_s"], s["sides"]["trl"]["target_s"]) == (32.0, 40.0)
    assert s["ratio"] == 32.0 / 40.0
    assert s["sides"]["rlgen"]["ratio_after_first_step"] == 2.0 / 30.0


def test_summary_when_a_side_never_reaches_the_target(peer):
    s = peer.learning_summary({"rlgen": {"points": RLGEN}, "trl": {"points": TRL}}, window=2, target=0.7)
    assert s["sides"]["rlgen"]["target_s"] == 36.0
    assert s["sides"]["trl"]["target_s"] is None and s["sides"]["trl"]["target_step"] is None
    assert s["ratio"] is None


def test_summary_of_one_side_or_a_side_without_steps(peer):
    alone = peer.learning_summary({"rlgen": {"points": RLGEN}}, window=10)  # window over all 5 steps: 0.6
    assert alone["target"] == alone["sides"]["rlgen"]["best_reward"] == 0.6
    assert alone["sides"]["rlgen"]["target_s"] == 38.0 and alone["ratio"] is None
    failed = peer.learning_summary({"rlgen": {"points": RLGEN}, "trl": {"points": []}}, window=2)
    assert failed["target"] is None and failed["ratio"] is None
    assert failed["sides"]["trl"]["launch_to_first_step_s"] is None
    assert failed["sides"]["rlgen"]["best_reward"] == 0.75


def test_read_rlgen_metrics(peer, tmp_path: Path):
    recs = [{"step": 0, "reward_mean": 0.25, "loss": 0.5, "grad_norm": 1.0, "t_end": 1012.5,
             "timeline": [{"actor": "learner0", "phase": "train", "start": 1010.0, "end": 1012.0}]},
            {"step": 1, "reward_mean": 0.5, "loss": math.nan, "grad_norm": 2.0,  # no t_end: the spans' last end
             "timeline": [{"actor": "engine0", "phase": "generate", "start": 1012.5, "end": 1014.0},
                          {"actor": "learner0", "phase": "train", "start": 1014.0, "end": 1015.25}]}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    points, checks = peer.read_rlgen_metrics(path, launched=1000.0)
    assert points == [{"step": 1, "seconds": 12.5, "reward": 0.25}, {"step": 2, "seconds": 15.25, "reward": 0.5}]
    assert peer.first_nonfinite(checks) == {"step": 2, "key": "loss", "value": "nan"}
    assert peer.read_rlgen_metrics(tmp_path / "absent.jsonl", 0.0) == ([], [])


def test_read_trl_result(peer):
    res = {"step_ends": [1010.0, 1011.5, 1013.0],
           "logs": [{"step": 1, "loss": 0.5, "reward": 0.25, "grad_norm": 1.0},
                    {"step": 2, "loss": 0.25, "reward": 0.5, "grad_norm": math.inf},
                    {"step": 3, "loss": 0.0, "reward": 0.75},
                    {"step": 3, "train_runtime": 13.0, "train_loss": 0.25}]}  # the closing log: no reward
    points, checks = peer.read_trl_result(res, launched=1000.0)
    assert points == curve([10.0, 11.5, 13.0], [0.25, 0.5, 0.75])
    assert peer.first_nonfinite(checks) == {"step": 2, "key": "grad_norm", "value": "inf"}
    assert peer.read_trl_result({}, 0.0) == ([], [])


def test_write_learning_gives_strict_json_a_plot_and_a_table(peer, tmp_path: Path, capsys):
    report = {"spec": {"prompts": 64, "samples": 8}, "window": 2, "target": None,
              "sides": {"rlgen": {"rc": 0, "points": RLGEN, "nonfinite": None},
                        "trl": {"rc": 0, "points": TRL + [{"step": 6, "seconds": 60.0, "reward": math.nan}],
                                "nonfinite": {"step": 6, "key": "loss", "value": "nan"}}}}
    peer.write_learning(tmp_path, report)
    text = (tmp_path / "learning.json").read_text()
    saved = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in learning.json"))
    assert saved["sides"]["trl"]["points"][-1]["reward"] is None
    assert saved["summary"]["ratio"] == 34.0 / 50.0
    assert (tmp_path / "learning.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "| trl | 0 | 6 | 10.0 | 0.625 | 0.625 | 5 | 50.0 | 40.0 | - | loss at step 6 |" in out
    assert "seconds to it: 0.68 (goal <= 0.5)" in out
