"""build_plan: placement, transport, batch geometry, engine environment, serialisation."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest

from rlgen.config import LearnerKind
from rlgen.config.compose import compose_run_config
from rlgen.plan import (
    BatchGeometry,
    EngineSlot,
    Layout,
    LearnerSlot,
    Plan,
    PlanError,
    Transport,
    build_plan,
    count_params,
)


@functools.cache
def _cfg(*overrides: str):
    return compose_run_config(list(overrides))


def plan_of(*overrides: str) -> Plan:
    return build_plan(_cfg(*overrides))


def test_cpu_plan():
    plan = plan_of("hardware=cpu")
    assert plan.device == "cpu"
    assert plan.engine_kind == "hf"
    assert plan.engines == (EngineSlot(index=0, node=0, gpus=(), tensor_parallel_size=1),)
    assert plan.learners == (LearnerSlot(rank=0, node=0, gpu=None),)
    assert plan.transport is Transport.ray_object_store
    assert not plan.colocated
    assert plan.warnings == ()
    assert plan.engine_env == {}  # vLLM settings never reach an hf engine


def test_several_cpu_learner_ranks_plan_as_torch_learner_ranks():
    # The torch learner trains with several data-parallel ranks on CPU (gloo); each gets its shard of the rows.
    plan = plan_of("hardware.learner_ranks=2")
    assert plan.learner_kind.value == "torch" and len(plan.learners) == 2 and plan.batch.learner_ranks == 2


def test_several_torch_learner_ranks_on_gpus_are_refused_by_the_plan():
    with pytest.raises(PlanError, match=r"4 learner ranks, but the torch learner trains with several only on CPU; use "
                                        r"learner.kind=auto \(DeepSpeed\)"):
        plan_of("hardware=8xh100", "engine=vllm", "learner.kind=torch", "hardware.colocated=false",
                "hardware.engine_gpus=4", "hardware.learner_gpus=4")


def test_two_cpu_nodes_put_engines_on_the_first_and_the_learner_on_the_last():
    plan = plan_of("hardware=2xcpu", "engine.num_engines=2")
    assert [e.node for e in plan.engines] == [0, 0] and [lr.node for lr in plan.learners] == [1]
    three = plan_of("hardware=2xcpu", "hardware.nodes=3", "engine.num_engines=3")
    assert [e.node for e in three.engines] == [0, 1, 0] and [lr.node for lr in three.learners] == [2]
    assert plan_of("hardware=cpu").learners[0].node == 0  # one node: everything on it


@pytest.mark.parametrize("engine, gpus", [("vllm", 2), ("vllm_tp2", 2), ("vllm", 4), ("vllm_tp2", 4)])
def test_hybrid_colocation_puts_a_learner_rank_and_engines_on_every_gpu(engine, gpus):
    plan = plan_of(f"engine={engine}", f"hardware={gpus}xh100", "hardware.colocated=true", "model=qwen2_5_1_5b")
    assert plan.layout is Layout.colocated and plan.transport is Transport.cuda_ipc
    assert plan.learners == tuple(LearnerSlot(r, 0, r) for r in range(gpus))  # a DeepSpeed rank on every GPU
    tp = 2 if engine == "vllm_tp2" else 1
    assert {g for e in plan.engines for g in e.gpus} == set(range(gpus))  # and engines on every GPU too
    assert all(e.tensor_parallel_size == tp for e in plan.engines) and plan.batch.learner_ranks == gpus
    assert plan.memory is not None and 0 < plan.memory.engine_fraction < 0.6 and plan.memory.colocated


def test_vllm_on_one_h100_is_colocated_over_cuda_ipc():
    plan = plan_of("engine=vllm", "hardware=1xh100", "engine.engines_per_gpu=1")
    assert plan.device == "cuda"
    assert plan.colocated and plan.layout is Layout.colocated
    # the engine's part of the GPU is on its slot, the share the plan derived
    share = plan.config.engine.gpu_memory_utilization
    assert 0 < share < 0.9 and plan.engines == (EngineSlot(0, 0, (0,), 1, memory_share=share),)
    assert plan.learners == (LearnerSlot(0, 0, 0),)
    assert plan.transport is Transport.cuda_ipc
    assert plan.learner_kind is LearnerKind.deepspeed and plan.engine.kind == "vllm"


def test_vllm_on_two_h200_splits_engine_and_learner_over_nccl():
    plan = plan_of("engine=vllm", "hardware=2xh200", "hardware.colocated=false")
    assert not plan.colocated and plan.layout is Layout.split
    assert plan.engines == (EngineSlot(0, 0, (0,), 1, memory_share=0.9),)  # own GPU: vLLM's default share
    assert plan.learners == (LearnerSlot(0, 0, 1),)
    assert plan.transport is Transport.nccl


def test_hf_on_gpus_moves_weights_through_the_object_store():
    plan = plan_of("hardware=2xh200")
    assert plan.device == "cuda"
    assert plan.engines == (EngineSlot(0, 0, (0,), 1),)
    assert plan.transport is Transport.ray_object_store


def test_vllm_tp2_on_8xh100():
    plan = plan_of("engine=vllm_tp2", "hardware=8xh100", "hardware.engine_gpus=4")
    assert plan.engines == (EngineSlot(0, 0, (0, 1), 2, 0.9), EngineSlot(1, 0, (2, 3), 2, 0.9))
    assert plan.learners == tuple(LearnerSlot(r, 0, 4 + r) for r in range(4))
    assert plan.transport is Transport.nccl
    assert plan.batch.learner_ranks == 4


def test_vllm_tp2_on_two_nodes_fills_node_0_with_engines_and_node_1_with_learners():
    plan = plan_of("engine=vllm_tp2", "hardware=2x8xh100", "hardware.engine_gpus=8")
    assert plan.nodes == 2 and plan.gpus_per_node == 8
    assert [e.gpus for e in plan.engines] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert {e.node for e in plan.engines} == {0}
    assert all(e.tensor_parallel_size == 2 for e in plan.engines)
    assert plan.learners == tuple(LearnerSlot(r, 1, r) for r in range(8))
    assert plan.transport is Transport.nccl


def test_engines_spill_onto_the_next_node_in_whole_tp_groups():
    plan = plan_of(
        "engine=vllm_tp2", "hardware=2x8xh100", "hardware.engine_gpus=12", "hardware.learner_gpus=4"
    )
    assert [(e.node, e.gpus) for e in plan.engines] == [
        (0, (0, 1)),
        (0, (2, 3)),
        (0, (4, 5)),
        (0, (6, 7)),
        (1, (0, 1)),
        (1, (2, 3)),
    ]
    assert [(lr.node, lr.gpu) for lr in plan.learners] == [(1, 4), (1, 5), (1, 6), (1, 7)]


GPU_LAYOUTS = [
    ("engine=vllm", "hardware=1xh100"),
    ("engine=vllm", "hardware=2xh200"),
    ("engine=vllm_tp2", "hardware=4xh200"),
    ("engine=vllm_tp2", "hardware=8xh100"),
    ("engine=vllm_tp4", "hardware=8xh200"),
    ("engine=vllm", "hardware=2x8xh100"),
    ("engine=vllm_tp2", "hardware=2x8xh100"),
    ("engine=vllm_tp4", "hardware=2x8xh100"),
    ("engine=vllm_tp2", "hardware=8xh100", "hardware.colocated=true"),
]


@pytest.mark.parametrize("overrides", GPU_LAYOUTS, ids=[" ".join(o) for o in GPU_LAYOUTS])
def test_gpu_slots_are_in_range_distinct_and_tp_groups_stay_on_one_node(overrides):
    plan = build_plan(_cfg(*overrides), runnable=False)  # geometry only, whichever learner would train it
    engine_gpus = [(e.node, g) for e in plan.engines for g in e.gpus]
    learner_gpus = [(lr.node, lr.gpu) for lr in plan.learners]
    for node, gpu in engine_gpus + learner_gpus:
        assert 0 <= node < plan.nodes and 0 <= gpu < plan.gpus_per_node
    per_gpu = plan.config.engine.engines_per_gpu  # the plan's default puts two small-model engines on a GPU
    assert len(set(engine_gpus)) * per_gpu == len(engine_gpus), "engines share a GPU beyond engines_per_gpu"
    assert len(set(learner_gpus)) == len(learner_gpus), "two learner ranks share a GPU"
    for e in plan.engines:
        assert len(e.gpus) == e.tensor_parallel_size
        assert list(e.gpus) == list(
            range(e.gpus[0], e.gpus[0] + e.tensor_parallel_size)
        )  # one node, contiguous
    if plan.colocated:
        assert set(engine_gpus) == set(learner_gpus)
    else:
        assert not set(engine_gpus) & set(learner_gpus)
    assert [e.index for e in plan.engines] == list(range(len(plan.engines)))
    assert [lr.rank for lr in plan.learners] == list(range(len(plan.learners)))


def test_fewer_engines_than_gpus_leaves_gpus_idle_with_a_warning():
    plan = plan_of("engine=vllm", "hardware=8xh100", "engine.num_engines=1", "hardware.engine_gpus=4")
    assert plan.engines == (EngineSlot(0, 0, (0,), 1, 0.9),)
    assert plan.learners == tuple(LearnerSlot(r, 0, 4 + r) for r in range(4))  # learners keep GPUs 4..7
    assert "3 of 4 engine GPUs stay idle with engine.num_engines=1." in plan.warnings


def test_idle_warning_counts_tp_gpus():
    plan = plan_of("engine=vllm_tp2", "hardware=8xh100", "engine.num_engines=1", "hardware.engine_gpus=4")
    assert plan.engines == (EngineSlot(0, 0, (0, 1), 2, 0.9),)
    assert any(w.startswith("2 of 4 engine GPUs stay idle") for w in plan.warnings)


def test_full_engine_gpus_give_no_idle_warning():
    plan = plan_of("engine=vllm_tp2", "hardware=8xh100", "engine.num_engines=2")
    assert len(plan.engines) == 2
    assert not any("idle" in w for w in plan.warnings)


def test_removed_vllm_env_vars_are_dropped_with_a_warning():
    cfg = _cfg("engine=vllm", "hardware=2xh200", "+engine.env.MY_FLAG=on", "+engine.env.VLLM_USE_V1=1",
               "+engine.env.VLLM_ATTENTION_BACKEND=FLASH_ATTN")  # a config written for older vLLM
    plan = build_plan(cfg)
    assert "VLLM_USE_V1" not in plan.engine_env
    assert "VLLM_ATTENTION_BACKEND" not in plan.engine_env
    assert plan.engine_env["NCCL_CUMEM_ENABLE"] == "0"
    assert plan.engine_env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert plan.engine_env["MY_FLAG"] == "on"
    assert set(plan.engine_env) == set(cfg.engine.env) - {"VLLM_USE_V1", "VLLM_ATTENTION_BACKEND"}
    for name in ("VLLM_USE_V1", "VLLM_ATTENTION_BACKEND"):
        assert sum(f"engine.env.{name} is not passed on" in w for w in plan.warnings) == 1
    assert any("attention_backend" in w for w in plan.warnings)  # says what replaces it
    assert "VLLM_USE_V1" in cfg.engine.env  # the config itself is left alone


def test_batch_geometry():
    plan = plan_of(
        "engine=vllm_tp2",
        "hardware=8xh100",
        "hardware.engine_gpus=4",
        "algo.prompts_per_step=8",
        "algo.samples_per_prompt=4",
        "algo.max_new_tokens=16",
        "task.max_prompt_tokens=32",
    )
    assert plan.batch == BatchGeometry(
        prompts_per_step=8,
        samples_per_prompt=4,
        sequences_per_step=32,
        learner_ranks=4,
        sequences_per_rank=8,
        max_prompt_tokens=32,
        max_new_tokens=16,
        max_seq_len=48,
    )


def test_default_batch_geometry_on_cpu():
    b = plan_of().batch
    assert (b.prompts_per_step, b.samples_per_prompt, b.sequences_per_step) == (64, 8, 512)
    assert (b.learner_ranks, b.sequences_per_rank) == (1, 512)
    assert b.max_seq_len == b.max_prompt_tokens + b.max_new_tokens == 12


def test_async_steps_carried_into_the_plan():
    assert plan_of("algo.async_steps=2").async_steps == 2
    assert plan_of().async_steps == 0


def test_multi_turn_tasks_launch_two_batches_ahead_where_engines_run_ahead():
    def derived(*overrides: str) -> tuple[int, str]:
        plan = plan_of(*overrides)
        why = next(s.source for s in plan.settings if s.key == "algo.async_steps")
        return plan.async_steps, why

    for hw in (("hardware=1xh100",), ("hardware=2xh200",)):
        assert derived("engine=vllm", *hw, "task=calculator", "model=qwen2_5_0_5b")[0] == 2
        assert derived("engine=vllm", *hw, "task=calculator", "model=qwen2_5_0_5b")[1].startswith("derived: multi-turn episodes")
        assert derived("engine=vllm", *hw)[0] == 1  # single-turn: one batch ahead
    assert plan_of("engine=vllm", "hardware=1xh100", "task=calculator", "model=qwen2_5_0_5b", "algo.async_steps=1").async_steps == 1
    assert plan_of("hardware=cpu", "task=chain").async_steps == 0  # on CPU: on-policy


@pytest.mark.parametrize(
    ("model", "params"),
    [("qwen2_5_0_5b", 494_032_768), ("qwen2_5_1_5b", 1_543_714_304), ("qwen2_5_7b", 7_615_616_512)],
)
def test_parameter_count_matches_the_published_checkpoints(model, params):
    cfg = _cfg(f"model={model}")
    assert count_params(cfg.model)[0] == params
    summary = build_plan(cfg).model
    assert summary.params == params
    assert summary.weight_gib_bf16 == pytest.approx(params * 2 / 2**30)


def test_kv_bytes_per_token():
    # Qwen2.5-0.5B: 24 layers x 2 KV heads x 64 head dim x (K and V) x 2 bytes
    assert plan_of("model=qwen2_5_0_5b").model.kv_bytes_per_token == 24 * 2 * 64 * 2 * 2


def test_to_json_round_trips():
    plan = plan_of("engine=vllm_tp2", "hardware=8xh100", "hardware.engine_gpus=4")
    d = json.loads(plan.to_json())
    assert d == plan.to_dict() | {
        "engines": [dataclasses.asdict(e) | {"gpus": list(e.gpus)} for e in plan.engines],
        "learners": [dataclasses.asdict(lr) for lr in plan.learners],
        "warnings": list(plan.warnings),
        "settings": [dataclasses.asdict(s) for s in plan.settings],
    }
    assert d["transport"] == "nccl"
    assert [e["gpus"] for e in d["engines"]] == [[0, 1], [2, 3]]
    assert [lr["gpu"] for lr in d["learners"]] == [4, 5, 6, 7]
    assert d["batch"]["sequences_per_rank"] == 128  # 64 prompts x 8 samples over 4 ranks
    assert "VLLM_USE_V1" not in d["engine_env"]
    assert json.loads(json.dumps(d)) == d


def test_plan_is_frozen():
    plan = plan_of("engine=vllm_tp2", "hardware=8xh100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.engines = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.batch.learner_ranks = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.engines[0].gpus = (5,)  # type: ignore[misc]
    assert (
        isinstance(plan.engines, tuple)
        and isinstance(plan.learners, tuple)
        and isinstance(plan.warnings, tuple)
    )
    assert plan.engines[0].gpus == (0, 1)


def test_build_plan_is_deterministic():
    assert plan_of("engine=vllm_tp2", "hardware=2x8xh100") == build_plan(
        compose_run_config(["engine=vllm_tp2", "hardware=2x8xh100"])
    )


def test_the_learners_logits_are_one_chunk_and_a_budget_too_big_names_one_that_fits():
    big = ["engine=vllm", "hardware=1xh100", "model=qwen2_5_1_5b", "algo.prompts_per_step=32", "algo.samples_per_prompt=8",
           "algo.max_new_tokens=256", "task.max_prompt_tokens=64"]
    # the whole batch in one pass: 256 rows of up to 320 tokens, but logits only ever of one chunk of the LM head
    whole = build_plan(compose_run_config([*big, "algo.micro_batch_tokens=0"]))
    assert "logits 2.0" in whole.memory.learner_parts and whole.batch.sequences_per_rank == 256
    with pytest.raises(PlanError) as err:
        build_plan(compose_run_config([*big, "algo.micro_batch_tokens=1048576"]))
    (problem,) = [m for m in err.value.problems if "a learner rank needs" in m]
    fix = int(problem.split("use algo.micro_batch_tokens=")[1].split(",")[0])
    plan = build_plan(compose_run_config([*big, f"algo.micro_batch_tokens={fix}"]))  # the suggestion is accepted
    assert plan.config.algo.micro_batch_tokens == fix > 320
    # left to the plan, the budget is the recipe's 32,768 tokens, which fits
    (tokens,) = [s for s in build_plan(compose_run_config(big)).settings if s.key == "algo.micro_batch_tokens"]
    assert tokens.value == 32768 and tokens.source.startswith("derived: the most packed tokens")
