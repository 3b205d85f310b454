"""precision=fp16 (docs/correctness.md, "Precision"): the torch learner's fp16 forwards over float32 master weights
with torch's GradScaler, an overflow skipped and counted (never taken for a non-finite step, by the learner's
health or the circuit breaker), the scale kept in checkpoints; DeepSpeed's fp16 config; the plan's engine dtype,
its refusals and the model folder's range."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file
from test_monitor import _cfg, _metrics
from test_torch_learner import load, make_batch

from helpers import algo_cfg, tiny_qwen2
from rlgen.config import MonitorConfig
from rlgen.config.compose import compose_run_config
from rlgen.learners.ds_setup import build_ds_config
from rlgen.learners.torch import TorchLearner
from rlgen.plan import PlanError, build_plan
from rlgen.runtime.state.breaker import CircuitBreaker


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    tiny_qwen2().save_pretrained(path)
    return {"qwen2": str(path)}


def tiny_start(path: str) -> list[torch.Tensor]:
    return [p.detach() for p in load(path).parameters()]


def set_scale(learner: TorchLearner, value: float) -> None:
    learner.scaler.scale(torch.ones(()))  # the scaler makes its scale on first use
    learner.scaler.update(new_scale=value)


def _learner(path: str, **kw) -> TorchLearner:
    return TorchLearner(path, algo_cfg(lr=1e-3), MonitorConfig(), precision="fp16", **kw)


def test_fp16_trains_over_float32_master_weights_as_float32_does(model_dirs):
    path = model_dirs["qwen2"]
    batch = make_batch(load(path))
    half, full = _learner(path), TorchLearner(path, algo_cfg(lr=1e-3), MonitorConfig())
    got, want = half.train_step(batch), full.train_step(batch)
    assert got.version == want.version == 1 and not got.overflow and got.skip_reason is None
    assert all(p.dtype == torch.float32 for p in half.model.parameters())  # the master weights
    assert half.scaler.get_scale() == 65536.0
    assert got.metrics["loss"] == pytest.approx(want.metrics["loss"], abs=5e-3)  # fp16 forwards: close, not equal
    assert got.metrics["mismatch/k3_kl"] != want.metrics["mismatch/k3_kl"]  # they did compute in fp16
    assert got.metrics["grad_norm"] == pytest.approx(want.metrics["grad_norm"], rel=0.02)  # the loss's gradient
    start = tiny_start(path)
    same = [torch.sign(a - s0) == torch.sign(b - s0) for a, b, s0 in zip(half.model.parameters(),
                                                                       full.model.parameters(), start)]
    agree = sum(int(m.sum()) for m in same) / sum(m.numel() for m in same)
    assert agree > 0.95  # AdamW's first step moves each weight by about lr, the same way (tiny gradients may flip)


def test_an_overflow_is_skipped_counted_and_lowers_the_scale(model_dirs):
    path = model_dirs["qwen2"]
    batch = make_batch(load(path))
    learner = _learner(path)
    before = [p.detach().clone() for p in learner.model.parameters()]
    set_scale(learner, 2.0**40)  # fp16 gradients of a loss this large overflow
    out = learner.train_step(batch)
    assert out.overflow and out.skipped and out.version == 0 and out.skip_reason.startswith("fp16 overflow at step 0")
    assert out.record()["overflow_skip"] is True
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    assert learner.scaler.get_scale() == 2.0**39  # halved
    assert learner.overflow_skips == 1 and learner.consecutive_skips == 0 and learner.health()["ok"]
    set_scale(learner, 1024.0)
    again = learner.train_step(batch)
    assert again.version == 1 and not again.overflow and math.isfinite(again.metrics["loss"])


def test_a_nan_under_fp16_is_a_non_finite_step_not_an_overflow(model_dirs):
    path = model_dirs["qwen2"]
    batch = make_batch(load(path), advantages=[float("nan"), 0.0, 0.0, 0.0])
    out = _learner(path).train_step(batch)
    assert out.skipped and not out.overflow and "non-finite" in out.skip_reason


def test_the_loss_scale_is_kept_in_a_checkpoint(model_dirs, tmp_path):
    path = model_dirs["qwen2"]
    learner = _learner(path)
    set_scale(learner, 512.0)
    learner.train_step(make_batch(load(path)))
    learner.save_checkpoint(str(tmp_path))
    back = _learner(str(tmp_path / "model"), resume_from=str(tmp_path))
    assert back.scaler.get_scale() == learner.scaler.get_scale() and back.version == learner.version


def test_the_breaker_does_not_count_overflow_skips_as_non_finite():
    breaker = CircuitBreaker(_cfg(max_nonfinite_steps=2))
    overflow = {**_metrics(1e-6, skipped=True), "overflow_skip": True, "skip_reason": "fp16 overflow at step 0"}
    assert all(breaker.update(s, overflow) is None for s in range(6))
    assert breaker.update(6, _metrics(1e-6, skipped=True)).action.value == "warn"
    assert breaker.update(7, overflow) is None  # neither grows nor ends the non-finite streak
    assert breaker.update(8, _metrics(1e-6, skipped=True)).action.value == "halt"


def test_deepspeed_takes_fp16_with_dynamic_loss_scaling():
    cfg = build_ds_config(algo_cfg(), zero_stage=2, precision="fp16")
    assert cfg["fp16"]["enabled"] and cfg["fp16"]["loss_scale"] == 0 and "bf16" not in cfg
    assert build_ds_config(algo_cfg(), zero_stage=2)["bf16"]["enabled"] and "fp16" not in build_ds_config(
        algo_cfg(), zero_stage=2)


def _plan(*overrides):
    return build_plan(compose_run_config(list(overrides)))


def test_the_plan_sets_the_engines_dtype_from_precision_and_refuses_what_cannot_work():
    gpu = ("engine=vllm", "hardware=1xh200", "model=qwen2_5_0_5b")
    assert _plan(*gpu).config.engine.dtype == "bfloat16"
    assert _plan(*gpu, "precision=fp16").config.engine.dtype == "float16"
    for bad, words in ((("precision=fp16",), "precision=fp16 is for GPUs"),
                       ((*gpu, "precision=fp16", "engine.dtype=bfloat16"), "set engine.dtype=float16")):
        with pytest.raises(PlanError) as err:
            _plan(*bad)
        assert any(words in p for p in err.value.problems)


def test_a_model_folder_beyond_fp16s_range_is_refused_by_name(tmp_path):
    model = tiny_qwen2(0).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "ok")
    gpu = ("engine=vllm", "hardware=1xh200", "precision=fp16")
    plan = _plan(*gpu, f"model.path={tmp_path / 'ok'}")
    (note,) = [s for s in plan.settings if s.key == "model range"]
    assert "within fp16's 65504" in note.value and "saved in bfloat16" in note.value
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.norm.weight"][3] = 1e5
    model.save_pretrained(tmp_path / "big", state_dict=state)
    with pytest.raises(PlanError) as err:
        _plan(*gpu, f"model.path={tmp_path / 'big'}")
    assert any("model.norm.weight (9.984e+04)" in p and "precision=bf16" in p for p in err.value.problems)  # bf16-rounded
    save_file({"w": torch.full((4,), 7.0)}, str(tmp_path / "ok" / "extra.safetensors"))  # float32 read too
    assert _plan(*gpu, f"model.path={tmp_path / 'ok'}")
