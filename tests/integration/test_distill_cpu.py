"""On-policy distillation end to end on a local Ray cluster on CPU: the teacher scores every step as a phase of
its own (with packing, partial rollouts and a LoRA student), a teacher equal to the student gives no signal, and a
student distilled alone from a trained teacher learns its policy: its reward rises without training on rewards,
and its reverse KL to the teacher falls. (Against RL alone: docs/benchmarks.md, "On-policy distillation on CPU".)"""

from __future__ import annotations

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime.run import run_training

pytestmark = pytest.mark.usefixtures("no_placement_group_left")  # the runs share one local cluster


def _run(out, overrides: list[str]):
    cfg = compose_run_config(["progress=false", *overrides])
    summary = run_training(build_plan(cfg), out)
    return read_jsonl(out / "metrics.jsonl"), summary


@pytest.mark.parametrize("extra", [["algo.partial_rollouts=0.25"], ["learner.lora.rank=4"]],
                         ids=["partial-rollouts", "lora-student"])
def test_the_teacher_scores_each_step_as_a_phase_of_its_own(tmp_path, extra):
    # the tiny preset as teacher is the student's own start: no signal at step 0, then the task's half moves it
    records, _ = _run(tmp_path, ["algo=distill", "algo.teacher=tiny", "algo.distill_coef=0.5", "steps=4",
                                 "algo.prompts_per_step=8", *extra])
    assert len(records) == 4 and not any(r["skipped"] for r in records)
    gaps = [r["distill/reverse_kl"] for r in records]
    assert abs(gaps[0]) < 1e-4, gaps  # one model on both sides: the engine's logprobs are the teacher's
    assert max(abs(g) for g in gaps[1:]) > 1e-4, gaps  # the student moved away from it
    for r in records:
        spans = [s for s in r["timeline"] if s["phase"] == "teacher"]
        assert spans and r["teacher_s"] == pytest.approx(sum(s["end"] - s["start"] for s in spans), rel=1e-6)
        assert r["teacher_s"] > 0


def _mean(records: list[dict], key: str, first: bool) -> float:
    k = max(1, len(records) // 5)
    part = records[:k] if first else records[-k:]
    return sum(r[key] for r in part) / k


@pytest.mark.slow
@pytest.mark.long  # a 150-step teacher, then 150 steps of distillation alone from the same start
def test_a_student_distilled_alone_learns_the_teachers_policy(tmp_path):
    teacher_records, _ = _run(tmp_path / "teacher", ["steps=150"])
    distilled, _ = _run(tmp_path / "distill", ["algo=distill", f"algo.teacher={tmp_path / 'teacher' / 'final_model'}"])
    # distill_coef=1: the rewards train nothing, yet the reward rises as the student nears its teacher
    gain = _mean(distilled, "reward_mean", first=False) - _mean(distilled, "reward_mean", first=True)
    assert gain >= 0.2, gain
    assert _mean(distilled, "distill/reverse_kl", first=False) * 5 < _mean(distilled, "distill/reverse_kl", first=True)
    assert _mean(distilled, "reward_mean", first=False) > _mean(teacher_records, "reward_mean", first=True) + 0.2
