"""benchmarks/distill_report.py: the teacher's reward as the target, RL alone read from the teacher's own run, and
each distilled run's steps and seconds to the target, teacher scoring and reverse KL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import load_benchmark


@pytest.fixture(scope="module")
def dr():
    return load_benchmark("distill_report")


def _run(path: Path, rewards: list[float], step_s: float, teacher_s: float = 0.0) -> Path:
    path.mkdir()
    lines = []
    for i, r in enumerate(rewards):
        rec = {"step": i, "reward_mean": r, "step_s": step_s, "t_end": 100.0 + (i + 1) * step_s}
        if teacher_s:
            rec.update({"teacher_s": teacher_s, "distill/reverse_kl": 0.5 / (i + 1)})
        lines.append(json.dumps(rec))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_each_run_is_timed_to_the_teachers_reward(dr, tmp_path):
    teacher = _run(tmp_path / "teacher", [0.1 * i for i in range(10)], 1.0)  # last fifth: 0.85
    distilled = _run(tmp_path / "distill", [0.0, 0.5, 0.9, 0.9, 0.9, 0.9], 2.0, teacher_s=0.5)
    out = dr.report(teacher, [distilled], None, window=2)
    assert out["target"] == pytest.approx(0.85)
    rl, d = out["sides"]["rl"], out["sides"]["distill:distill"]
    assert rl["target_step"] == 10 and rl["target_s"] == pytest.approx(10.0)  # (0.8 + 0.9) / 2 at step 10
    assert d["target_step"] == 4 and d["target_s"] == pytest.approx(8.0)  # (0.9 + 0.9) / 2 at step 4
    assert d["ratio"] == pytest.approx(0.8)
    assert d["teacher_s_mean"] == 0.5 and d["teacher_share_of_step"] == pytest.approx(0.25)
    assert d["reverse_kl_first"] == 0.5 and d["reverse_kl_last"] == pytest.approx(0.5 / 6)


def test_a_run_that_never_reaches_the_target_says_so(dr, tmp_path):
    teacher = _run(tmp_path / "teacher", [0.9] * 5, 1.0)
    slow = _run(tmp_path / "slow", [0.1] * 5, 1.0, teacher_s=0.1)
    side = dr.report(teacher, [slow], None, window=2)["sides"]["distill:slow"]
    assert side["target_step"] is None and side["ratio"] is None
