"""On-policy distillation's teacher in the plan and at set-up: each bad teacher refused in one sentence, its weights
in the learner's memory model, where it runs shown by `rlgen plan`, a tokenizer of other ids refused, and the
learner loading it beside the policy."""

from __future__ import annotations

import pytest
from rich.console import Console

from helpers import algo_cfg, save_tiny_qwen2
from rlgen.config import MonitorConfig
from rlgen.config.compose import compose_run_config
from rlgen.learners.torch import TorchLearner
from rlgen.plan import PlanError, build_plan
from rlgen.plan.memory import learner_memory
from rlgen.plan.view import print_plan
from rlgen.runtime.errors import RunError
from rlgen.runtime.start import teacher as start_teacher

GPU = ["engine=vllm", "hardware=1xh200", "model=qwen2_5_1_5b"]


def _plan(*overrides):
    return build_plan(compose_run_config(list(overrides)))


def _refusal(*overrides) -> str:
    with pytest.raises(PlanError) as err:
        _plan(*overrides)
    return str(err.value)


def test_distill_without_a_teacher_is_refused_with_what_to_give():
    msg = _refusal("algo=distill")
    assert "algo=distill needs a teacher" in msg and "final_model" in msg and "qwen2_5_7b" in msg


def test_a_teacher_that_is_neither_a_preset_nor_a_model_folder_is_refused(tmp_path):
    assert "is not a folder" in _refusal("algo=distill", f"algo.teacher={tmp_path / 'nowhere'}")
    assert "has no readable config.json" in _refusal("algo=distill", f"algo.teacher={tmp_path}")


def test_the_mix_is_checked():
    assert "must be in [0, 1]" in _refusal("algo=distill", "algo.teacher=tiny", "algo.distill_coef=1.5")
    assert "has no effect without a teacher" in _refusal("algo.distill_coef=0.5")
    assert "algo.distill_estimator=full has no effect without a teacher" in _refusal("algo.distill_estimator=full")


def test_the_teacher_is_in_the_learners_memory_and_the_plan_shows_where_it_runs():
    student = _plan(*GPU)
    taught = _plan(*GPU, "algo=distill", "algo.teacher=qwen2_5_7b")
    assert taught.teacher is not None and taught.teacher.preset and taught.teacher.params > 7e9
    cfg = taught.config
    with_teacher = learner_memory(cfg, taught.model.params, taught.model.vocab_size, 1, 4096)
    without = learner_memory(student.config, student.model.params, student.model.vocab_size, 1, 4096)
    assert with_teacher.reference - without.reference == pytest.approx(taught.teacher.gib(2), rel=1e-6)
    console = Console(record=True, width=300)
    print_plan(taught, console)
    out = console.export_text()
    assert "the qwen2_5_7b preset" in out and "the learners' reference slot" in out
    assert "A_t = 0 A_task + 1 (log pi_teacher - log pi_engine)" in out and "distillation alone" in out
    console = Console(record=True, width=300)
    print_plan(_plan(*GPU, "algo=distill", "algo.teacher=qwen2_5_7b", "algo.distill_estimator=full",
                     "algo.distill_coef=0.5"), console)
    out = console.export_text()
    assert "A = 0.5 A_task; the loss adds 0.5 sum_v pi (log pi - log pi_teacher)" in out
    assert "forwards every micro-batch beside the policy" in out


def test_an_estimator_that_is_not_one_is_refused():
    from rlgen.config.compose import ConfigError

    with pytest.raises(ConfigError) as err:
        compose_run_config(["algo=distill", "algo.teacher=tiny", "algo.distill_estimator=topk"])
    assert "algo.distill_estimator=topk" in str(err.value) and "expected one of [sampled, full]" in str(err.value)


def test_a_folder_teacher_is_planned_by_its_absolute_path(tmp_path, monkeypatch):
    folder = save_tiny_qwen2(tmp_path / "teacher")
    monkeypatch.chdir(tmp_path)
    plan = _plan("algo=distill", "algo.teacher=teacher")
    assert plan.config.algo.teacher == folder and not plan.teacher.preset


class _Tok:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_a_teacher_whose_tokenizer_has_other_ids_is_refused_at_set_up(monkeypatch):
    monkeypatch.setattr(start_teacher, "load_tokenizer", lambda path: _Tok({"a": 0, "b": 2, "c": 1}))
    start_teacher.check_teacher_tokenizer("t", "/x", _Tok({"a": 0, "b": 2, "c": 1}))  # the same ids: fine
    with pytest.raises(RunError, match=r"does not share the student's tokenizer \(2 of its 3 tokens"):
        start_teacher.check_teacher_tokenizer("t", "/x", _Tok({"a": 0, "b": 1, "c": 2}))


def test_the_learner_loads_the_teacher_frozen_beside_the_policy(tmp_path):
    policy, teacher = save_tiny_qwen2(tmp_path / "p", seed=0), save_tiny_qwen2(tmp_path / "t", seed=1)
    learner = TorchLearner(policy, algo_cfg(teacher=teacher), MonitorConfig(), teacher_path=teacher)
    held = learner.core.teacher
    assert held is not None and not any(p.requires_grad for p in held.parameters())
    assert learner.core.ref_model is None  # the KL reference is another slot (algo.kl_coef)


def test_the_prediction_counts_the_teachers_forward_and_names_it():
    from rlgen.plan.prediction import predict

    plain, taught = _plan(*GPU), _plan(*GPU, "algo=distill", "algo.teacher=qwen2_5_7b")
    a, b = predict(plain), predict(taught)
    assert b.train_s > a.train_s and a.teacher_s == 0
    assert b.teacher_s == pytest.approx(b.train_s * 2 * taught.teacher.params
                                        / (6 * taught.model.params + 2 * taught.teacher.params))
    assert "the teacher's scoring takes" in b.verdict.advice and "smaller teacher" in b.verdict.advice


def test_the_balancer_reads_the_teacher_phase_from_a_steps_timeline():
    from rlgen.metrics.balance import measure

    spans = [{"actor": "engine0", "phase": "generate", "start": 0.0, "end": 1.0},
             {"actor": "learner0", "phase": "teacher", "start": 1.0, "end": 3.0},
             {"actor": "learner0", "phase": "train", "start": 3.0, "end": 5.0}]
    assert measure(spans, 100).teacher_s == pytest.approx(2.0)


def test_the_full_estimator_holds_the_teachers_head_beside_the_policys():
    sampled = _plan(*GPU, "algo=distill", "algo.teacher=qwen2_5_1_5b")
    full = _plan(*GPU, "algo=distill", "algo.teacher=qwen2_5_1_5b", "algo.distill_estimator=full")
    tokens = 8192
    a = learner_memory(sampled.config, sampled.model.params, sampled.model.vocab_size, 1, tokens)
    b = learner_memory(full.config, full.model.params, full.model.vocab_size, 1, tokens)
    assert b.logits == pytest.approx(2 * a.logits)  # the teacher's logits beside the student's, a chunk at a time
    teacher_hidden = 2 * tokens * full.teacher.model.hidden_size / 2**30  # its last hidden states, bf16
    assert b.activations - a.activations == pytest.approx(teacher_hidden, rel=1e-6)
