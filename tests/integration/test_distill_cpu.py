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


def _reaches(records: list[dict], target: float, window: int = 10) -> tuple[int, float] | None:
    """(step, seconds from the first step's start) where the mean reward of the last `window` steps first reaches
    target; None where it never does."""
    start = records[0]["t_end"] - records[0]["step_s"]
    for i in range(len(records)):
        part = records[max(0, i - window + 1): i + 1]
        if sum(r["reward_mean"] for r in part) / len(part) >= target:
            return records[i]["step"], records[i]["t_end"] - start
    return None


@pytest.mark.slow
@pytest.mark.long  # RL for 100 steps (the teacher, and RL alone), then 100 steps of distillation from the same start
def test_a_student_taught_the_teachers_whole_distribution_reaches_its_reward_before_rl_does(tmp_path):
    # a sparse reward (the whole reversed word or nothing) from a weak start: the teacher is the RL run itself, so
    # RL alone is its run step for step, and distillation starts from the same model and seed
    task = ["task=reverse", "task.reward=exact_match", "task.length=5", "algo.max_new_tokens=8",
            "model.warm_start_steps=80", "steps=100"]
    rl, _ = _run(tmp_path / "rl", task)
    taught, _ = _run(tmp_path / "full", [*task, "algo=distill", f"algo.teacher={tmp_path / 'rl' / 'final_model'}",
                                         "algo.distill_estimator=full"])
    target = _mean(rl, "reward_mean", first=False)  # the teacher's reward: its run's last fifth
    assert target > _mean(rl, "reward_mean", first=True) + 0.2  # the teacher learned
    by_rl, by_full = _reaches(rl, target), _reaches(taught, target)
    assert by_rl is not None and by_full is not None, (target, by_rl, by_full)
    assert by_full[0] < by_rl[0] and by_full[1] < by_rl[1], (target, by_rl, by_full)  # fewer steps and seconds
    assert _mean(taught, "distill/reverse_kl", first=False) * 5 < _mean(taught, "distill/reverse_kl", first=True)
