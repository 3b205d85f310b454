"""On-policy distillation end to end on a local Ray cluster on CPU: the teacher scores every step as a phase of
its own (with packing, partial rollouts and a LoRA student), a teacher equal to the student gives no signal, and a
student distilled from a stronger teacher reaches the teacher's reward in fewer steps and seconds than RL alone."""

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


def _curve(records: list[dict], window: int = 10) -> list[float]:
    rewards = [r["reward_mean"] for r in records]
    return [sum(rewards[max(0, i - window + 1): i + 1]) / len(rewards[max(0, i - window + 1): i + 1])
            for i in range(len(rewards))]


def _reached(records: list[dict], target: float) -> tuple[int, float] | None:
    """The first step whose smoothed reward reaches target, and the seconds from the first step's start to its end."""
    curve = _curve(records)
    hit = next((i for i, v in enumerate(curve) if v >= target), None)
    if hit is None:
        return None
    return hit, records[hit]["t_end"] - records[0]["t_end"] + records[0]["step_s"]


TEACHER_STEPS, STUDENT_STEPS = 450, 200


@pytest.mark.slow
@pytest.mark.long  # a 450-step teacher, then 200 steps of RL and of distillation from the same start
def test_a_student_distilled_from_a_stronger_teacher_reaches_its_reward_before_rl_alone(tmp_path):
    teacher_records, _ = _run(tmp_path / "teacher", [f"steps={TEACHER_STEPS}"])
    k = len(teacher_records) // 5
    target = sum(r["reward_mean"] for r in teacher_records[-k:]) / k  # the teacher's reward: its last fifth
    teacher = tmp_path / "teacher" / "final_model"
    rl, _ = _run(tmp_path / "rl", [f"steps={STUDENT_STEPS}"])
    distilled, _ = _run(tmp_path / "distill", [f"steps={STUDENT_STEPS}", "algo=distill", f"algo.teacher={teacher}"])
    got = _reached(distilled, target)
    assert got is not None, f"distillation never reached the teacher's {target:.3f}: {max(_curve(distilled)):.3f}"
    alone = _reached(rl, target)
    # RL alone, from the same start and seed, is the teacher's own run: it reached its reward late in its steps
    alone_steps = alone[0] if alone else STUDENT_STEPS
    assert got[0] < alone_steps, (got, alone)
    if alone:
        assert got[1] < alone[1], (got, alone)
