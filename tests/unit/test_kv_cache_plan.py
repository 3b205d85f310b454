"""engine.kv_cache_gib: where engines share their GPUs, the plan sizes each engine's KV cache from the batch it
generates (so vLLM does not measure, and engines and learner ranks start side by side); elsewhere vLLM measures.
A size in the config is taken as given and checked."""

from __future__ import annotations

import math

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.engines.vllm.args import build_engine_args
from rlgen.plan import PlanError, build_plan
from rlgen.plan.kv_cache import FIT, ROOM, share_left_gib
from rlgen.plan.memory import GIB
from rlgen.plan.prediction import predict

HYBRID_4 = ["engine=vllm", "hardware=4xh100", "model=qwen2_5_1_5b", "hardware.colocated=true"]


def plan_of(*overrides: str):
    return build_plan(compose_run_config(list(overrides)))


def kv_setting(plan):
    return next(((s.value, s.source) for s in plan.settings if s.key == "engine.kv_cache_gib"), None)


def test_hybrid_engines_get_twice_their_share_of_the_batch():
    plan = plan_of(*HYBRID_4)
    e, b = plan.config.engine, plan.batch
    assert len(plan.engines) == 8 and e.tensor_parallel_size == 1
    seqs = math.ceil(b.prompts_per_step / 8) * b.samples_per_prompt  # groups are dealt round-robin
    assert seqs == 64
    tokens = ROOM * seqs * math.ceil(b.max_seq_len / 16) * 16
    want = tokens * plan.model.kv_bytes_per_token / GIB
    value, source = kv_setting(plan)
    assert value == e.kv_cache_gib and want <= value < want + 0.01
    assert source.startswith("derived: 2 x the 64 sequences of up to 1032 tokens")
    # the cache is well inside what the engine's share leaves, and vLLM is handed it
    assert value <= FIT * share_left_gib(plan.config, plan.model, e.gpu_memory_utilization / 2)
    args = build_engine_args("/nowhere", e)
    assert args["kv_cache_memory_bytes"] == int(value * GIB)
    # the prediction reads the engine's capacity from it: every sequence of the engine's share fits at once
    pred = predict(plan)
    assert pred.max_concurrency >= 2 * seqs


def test_a_tp2_engine_holds_half_of_each_token_on_each_gpu():
    plan = plan_of("engine=vllm_tp2", "hardware=4xh100", "model=qwen2_5_1_5b", "hardware.colocated=true")
    b = plan.batch
    seqs = math.ceil(b.prompts_per_step / len(plan.engines)) * b.samples_per_prompt
    per_gpu = ROOM * seqs * math.ceil(b.max_seq_len / 16) * 16 * plan.model.kv_bytes_per_token / 2 / GIB
    assert per_gpu <= plan.config.engine.kv_cache_gib < per_gpu + 0.01


def test_a_tp4_engine_over_two_kv_heads_holds_a_whole_head_on_each_gpu():
    # the 1.5B has 2 KV heads: at TP 4 vLLM copies each onto 2 GPUs, so a GPU holds half of each token, not a quarter
    plan = plan_of("engine=vllm", "engine.tensor_parallel_size=4", "hardware=4xh100", "model=qwen2_5_1_5b",
                   "hardware.colocated=true")
    b = plan.batch
    seqs = math.ceil(b.prompts_per_step / len(plan.engines)) * b.samples_per_prompt
    per_gpu = ROOM * seqs * math.ceil(b.max_seq_len / 16) * 16 * plan.model.kv_bytes_per_token / 2 / GIB
    assert per_gpu <= plan.config.engine.kv_cache_gib < per_gpu + 0.01


@pytest.mark.parametrize("overrides", [
    # engines on GPUs of their own: nothing else allocates there, and vLLM takes what the GPU has
    ["engine=vllm", "hardware=4xh100", "model=qwen2_5_1_5b", "hardware.colocated=false", "hardware.engine_gpus=2"],
    # one GPU at 1.5B: twice the batch share does not fit well inside the engines' small share, so vLLM measures
    ["engine=vllm", "hardware=1xh100", "model=qwen2_5_1_5b"],
    # CPU engines have no KV-cache size to give
    [],
])
def test_elsewhere_vllm_measures(overrides):
    plan = plan_of(*overrides)
    assert plan.config.engine.kv_cache_gib is None and kv_setting(plan) is None
    assert "kv_cache_memory_bytes" not in build_engine_args("/nowhere", plan.config.engine)


def test_a_size_in_the_config_is_taken_and_checked():
    plan = plan_of(*HYBRID_4, "engine.kv_cache_gib=5")
    assert kv_setting(plan) == (5.0, "config")
    for value, said in (("0", "must be above 0"), ("0.01", "holds less than one 1032-token sequence"),
                        ("40", "do not fit its")):
        with pytest.raises(PlanError, match=said):
            plan_of(*HYBRID_4, f"engine.kv_cache_gib={value}")
    with pytest.raises(PlanError, match="engine.kv_cache_gib=2.0 has no effect with engine=hf"):
        plan_of("engine.kv_cache_gib=2")
