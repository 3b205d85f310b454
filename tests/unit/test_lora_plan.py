"""LoRA in the plan: the 7B recipe on one GPU picks LoRA because full fine-tuning cannot fit, and says so; a value
the user sets wins; the memory model and the checkpoint size know the adapters; the weight path follows the engine."""

from __future__ import annotations

import pytest

from rlgen.config import Transport
from rlgen.config.compose import compose_run_config
from rlgen.plan import PlanError, build_plan
from rlgen.plan.memory import adapter_params


def _setting(plan, key):
    return next(s for s in plan.settings if s.key == key)


def test_seven_b_on_one_gpu_picks_lora_and_says_why():
    plan = build_plan(compose_run_config(["engine=vllm", "hardware=1xh100", "model=qwen2_5_7b"]))
    lora = plan.config.learner.lora
    assert lora.enabled and lora.rank == 16 and lora.alpha == 32.0 and lora.sync == "merged"
    # the faster of the two ways in the side-by-side on one H100; adapters stay an option
    assert "ran faster than engine=vllm's adapters" in _setting(plan, "learner.lora.sync").source
    why = _setting(plan, "learner.lora.enabled").source
    assert why.startswith("derived: full fine-tuning needs about") and "GiB per learner rank" in why
    assert plan.config.learner.zero_stage == 2 and _setting(plan, "learner.zero_stage").source.startswith("derived: LoRA")
    assert plan.transport is Transport.cuda_ipc  # merged weights take the colocated IPC path
    # the frozen bf16 base (14.2 GiB) plus small adapter state: far under full fine-tuning's 147 GiB
    assert 14 < plan.memory.learner_idle_gib < 20 and plan.memory.learner_peak_gib < 40
    assert plan.checkpoint_gib < 1.0  # the adapters and their optimizer state, not the model
    # rank 16 on every block linear of Qwen2.5-7B: 40.4M parameters
    assert adapter_params(plan.config) == 40_370_176


def test_a_value_the_user_sets_wins():
    with pytest.raises(PlanError, match="more than the"):  # full fine-tuning of 7B cannot fit one GPU
        build_plan(compose_run_config(["engine=vllm", "hardware=1xh100", "model=qwen2_5_7b",
                                       "learner.lora.enabled=false"]))
    plan = build_plan(compose_run_config(["engine=vllm", "hardware=1xh100", "model=qwen2_5_7b",
                                          "learner.lora.rank=64", "learner.lora.sync=merged"]))
    assert plan.config.learner.lora.rank == 64 and _setting(plan, "learner.lora.rank").source == "config"
    assert plan.transport is Transport.cuda_ipc  # merged weights take the colocated IPC path


def test_models_that_fit_train_whole_and_cpu_runs_merge():
    plan = build_plan(compose_run_config(["engine=vllm", "hardware=1xh100", "model=qwen2_5_0_5b"]))
    assert plan.config.learner.lora.enabled is False
    assert _setting(plan, "learner.lora.enabled").source == "derived: full fine-tuning fits the learner GPUs"
    cpu = build_plan(compose_run_config(["learner.lora.rank=8"]))
    assert cpu.config.learner.lora.sync == "merged" and cpu.transport is Transport.ray_object_store


def test_lora_with_zero_stage_3_set_by_the_user_is_refused():
    with pytest.raises(PlanError, match="LoRA trains on ZeRO stage 2 here"):
        build_plan(compose_run_config(["engine=vllm", "hardware=1xh100", "model=qwen2_5_7b", "learner.zero_stage=3"]))


def test_engines_that_take_adapters_and_their_room():
    from rlgen.engines.vllm import engine_lora_rank
    from rlgen.engines.vllm.args import engine_args_for

    cpu = build_plan(compose_run_config(["learner.lora.rank=8", "learner.lora.sync=adapter"]))
    assert cpu.transport is Transport.lora_adapter  # hf engines take adapters through PEFT when asked
    gpu = ["engine=vllm", "hardware=1xh100", "model=qwen2_5_7b"]
    plan = build_plan(compose_run_config([*gpu, "learner.lora.sync=adapter"]))
    assert plan.transport is Transport.lora_adapter and _setting(plan, "learner.lora.sync").source == "config"
    assert engine_args_for(plan.transport, engine_lora_rank(plan.config, plan.transport))["max_lora_rank"] == 16
    capped = build_plan(compose_run_config([*gpu, "engine.max_lora_rank=8"]))
    assert capped.config.learner.lora.sync == "merged" and capped.transport is Transport.cuda_ipc
    assert "take adapters up to rank 8" in _setting(capped, "learner.lora.sync").source
    with pytest.raises(PlanError, match="the engines take adapters up to rank 8 .* raise engine.max_lora_rank to 16"):
        build_plan(compose_run_config([*gpu, "engine.max_lora_rank=8", "learner.lora.sync=adapter"]))
    merged = build_plan(compose_run_config([*gpu, "learner.lora.sync=merged"]))
    assert "enable_lora" not in engine_args_for(merged.transport, engine_lora_rank(merged.config, merged.transport))
    with pytest.raises(PlanError, match="engine.max_lora_rank=-1 must be 0"):
        build_plan(compose_run_config(["engine.max_lora_rank=-1"]))


def test_a_server_takes_adapters_when_its_engines_do():
    from rlgen.plan.serve import build_serve_plan, served_adapters

    hf = build_serve_plan(compose_run_config([]))
    assert served_adapters(hf.config, hf.engine) == (True, None)  # any rank, through PEFT
    vllm = build_serve_plan(compose_run_config(["engine=vllm", "hardware=1xh100", "model=small", "engine.max_model_len=128"]))
    assert served_adapters(vllm.config, vllm.engine) == (False, 0)  # vLLM sets room aside only when asked
    room = build_serve_plan(compose_run_config(["engine=vllm", "hardware=1xh100", "model=small", "engine.max_model_len=128", "engine.max_lora_rank=64"]))
    assert served_adapters(room.config, room.engine) == (True, 64)
    kwargs = room.engine.actor_kwargs(room.config, room.transport, {})
    assert kwargs["engine_args"]["enable_lora"] and kwargs["engine_args"]["max_lora_rank"] == 64
    off = build_serve_plan(compose_run_config(["engine.max_lora_rank=0"]))
    assert served_adapters(off.config, off.engine) == (False, 0)
