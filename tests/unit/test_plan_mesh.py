"""The learner mesh in the plan (rlgen.plan.mesh): learner.sequence_parallel as given, checked against the ranks
and the model's heads with a fix in each sentence, or chosen where left null (the smallest degree whose learner
holds the longest row); rows are shared out over the data ranks only; `rlgen plan` shows the mesh."""

from __future__ import annotations

import pytest

from rlgen.config import set_key
from rlgen.config.compose import compose_run_config
from rlgen.mesh import head_problem
from rlgen.plan import PlanError, build_plan
from rlgen.plan.memory import learner_memory


def plan_of(*overrides: str):
    return build_plan(compose_run_config(list(overrides)))


def setting(plan, key: str):
    return next(s for s in plan.settings if s.key == key)


def test_a_given_degree_makes_groups_that_share_rows():
    plan = plan_of("hardware.learner_ranks=4", "learner.sequence_parallel=2")
    assert (plan.mesh.data, plan.mesh.sequence) == (2, 2)
    assert plan.config.learner.sequence_parallel == 2
    assert plan.batch.sequences_per_rank == plan.batch.sequences_per_step // 2  # two data shards, not four
    assert setting(plan, "learner.sequence_parallel").source == "config"


def test_left_null_on_cpu_it_is_one():
    plan = plan_of("hardware.learner_ranks=2")
    assert (plan.mesh.data, plan.mesh.sequence) == (2, 1)
    assert setting(plan, "learner.sequence_parallel").source == "derived: CPU learners train whole rows"


@pytest.mark.parametrize(("overrides", "words"), [
    (["hardware.learner_ranks=2", "learner.sequence_parallel=3"], "does not divide the plan's 2 learner rank(s)"),
    (["learner.sequence_parallel=0"], "must be at least 1"),
    (["hardware.learner_ranks=8", "learner.sequence_parallel=8"], "does not divide the model's 4 attention heads"),
])
def test_a_degree_that_cannot_work_is_refused_with_its_fix(overrides, words):
    with pytest.raises(PlanError) as err:
        plan_of(*overrides)
    assert any(words in p for p in err.value.problems), err.value.problems


def test_heads_split_or_repeat_over_the_degree():
    assert head_problem(2, 4, 2) is None  # two key/value heads, one a rank
    assert head_problem(4, 4, 2) is None  # repeated: each of four ranks gets a copy of one
    assert "key/value heads" in head_problem(4, 12, 3)  # 3 neither splits over 4 nor divides it
    assert "degrees that fit: 2, 14)" in head_problem(4, 14, 2)  # Qwen2.5-0.5B: 14 heads, 2 key/value heads
    assert head_problem(1, 14, 2) is None


GPU_LONG = ["engine=vllm", "hardware=2xh200", "hardware.colocated=true", "model=qwen2_5_1_5b",
            "algo.max_new_tokens=32760", "learner.gradient_checkpointing=false"]


def test_left_null_on_gpus_a_tiled_mlp_comes_before_a_sequence_group():
    plan = plan_of(*GPU_LONG)  # the 1.5B's 32,768-token row without checkpoints: too big for a rank untiled
    assert (plan.mesh.data, plan.mesh.sequence) == (2, 1) and plan.config.learner.tiled_mlp is True
    assert "only with its MLPs tiled" in setting(plan, "learner.tiled_mlp").source
    short = plan_of(*GPU_LONG[:-2], "algo.max_new_tokens=1024")
    assert short.mesh.sequence == 1 and short.config.learner.tiled_mlp is False
    assert setting(short, "learner.sequence_parallel").source.startswith("derived: one")
    assert not any(s.key == "learner.tiled_mlp" for s in short.settings)  # shown only where it is on or given


def test_left_null_on_gpus_it_is_the_smallest_degree_whose_learner_holds_the_longest_row():
    plan = plan_of(*GPU_LONG, "learner.tiled_mlp=false")
    assert (plan.mesh.data, plan.mesh.sequence) == (1, 2)
    assert "only as a slice of 1/2" in setting(plan, "learner.sequence_parallel").source
    assert setting(plan, "learner.tiled_mlp").source == "config"


def test_the_memory_model_counts_one_tile_of_a_tiled_mlp():
    # at one rank's 32,768-token row without checkpoints only the tiled learner fits: the untiled one is the same
    # plan's memory model with the MLP whole
    tiled = plan_of(*GPU_LONG, "learner.tiled_mlp=true", "learner.sequence_parallel=1", "algo.async_steps=0")
    cfg, ms, tokens = tiled.config, tiled.model, tiled.config.algo.micro_batch_tokens
    untiled = learner_memory(set_key(cfg, "learner.tiled_mlp", False), ms.params, ms.vocab_size, 2, tokens)
    assert tiled.memory.learner_peak_gib < untiled.peak - 1.0
    with pytest.raises(PlanError, match="learner rank needs about"):
        plan_of(*GPU_LONG, "learner.tiled_mlp=false", "learner.sequence_parallel=1", "algo.async_steps=0")


def test_the_memory_model_gives_each_rank_its_slice_of_the_activations():
    one = plan_of(*GPU_LONG, "learner.sequence_parallel=1", "algo.async_steps=0")
    two = plan_of(*GPU_LONG, "learner.sequence_parallel=2", "algo.async_steps=0")
    assert two.memory.learner_peak_gib < one.memory.learner_peak_gib
    assert two.config.algo.micro_batch_tokens >= one.config.algo.micro_batch_tokens


def test_rlgen_plan_shows_the_mesh(capsys):
    from rlgen.cli import main

    assert main(["plan", "hardware.learner_ranks=4", "learner.sequence_parallel=2"]) in (0, None)
    out = " ".join(capsys.readouterr().out.split())
    assert "data 2 x sequence 2 (4 ranks)" in out and "Ulysses sequence parallelism" in out


H100_LONG = ["engine=vllm", "hardware=1xh100", "model=qwen2_5_1_5b", "algo.max_new_tokens=131000",
             "learner.lora.enabled=false"]


def test_on_one_gpu_the_plan_tiles_then_offloads_the_checkpoints_to_hold_the_longest_row():
    plan = plan_of(*H100_LONG)
    lc = plan.config.learner
    assert (plan.mesh.sequence, lc.tiled_mlp, lc.offload_checkpoints) == (1, True, True)
    assert "activation checkpoints in host memory" in setting(plan, "learner.offload_checkpoints").source
    both = ["learner.tiled_mlp=true", "algo.async_steps=0"]  # an engine asleep while the learner trains: room for either
    kept = plan_of(*H100_LONG, *both, "learner.offload_checkpoints=false")
    offloaded = plan_of(*H100_LONG, *both, "learner.offload_checkpoints=true")
    assert kept.config.learner.offload_checkpoints is False
    assert offloaded.memory.learner_peak_gib < kept.memory.learner_peak_gib


def test_offloaded_checkpoints_without_checkpoints_are_refused():
    with pytest.raises(PlanError, match="learner.gradient_checkpointing=true on the DeepSpeed learner"):
        plan_of(*GPU_LONG, "learner.offload_checkpoints=true")


SEVEN_B_LONG = ["engine=vllm", "hardware=2xh200", "model=qwen2_5_7b", "algo.max_new_tokens=65536"]


def test_the_7b_at_65536_on_two_gpus_plans_a_sequence_group_that_trains_the_whole_model(capsys):
    from rlgen.cli import main

    plan = plan_of(*SEVEN_B_LONG)
    lc = plan.config.learner
    assert plan.colocated and (plan.mesh.data, plan.mesh.sequence) == (1, 2)
    assert lc.lora.enabled is False and lc.offload_checkpoints is False  # a sequence group before host memory
    assert "only as a slice of 1/2" in setting(plan, "learner.sequence_parallel").source
    assert "of those that train the whole model" in setting(plan, "hardware.colocated").source
    assert main(["plan", *SEVEN_B_LONG]) in (0, None)
    out = " ".join(capsys.readouterr().out.split())
    assert "data 1 x sequence 2 (2 ranks)" in out and "Ulysses sequence parallelism" in out
    assert "split 1+1, TP 1 trains only LoRA adapters: full fine-tuning does not fit it" in out


def test_lora_asked_for_keeps_the_layout_the_prediction_picks():
    plan = plan_of(*SEVEN_B_LONG, "learner.lora.enabled=true")
    assert plan.config.learner.lora.enabled and setting(plan, "hardware.colocated").source.startswith(
        "derived: the layout predicted fastest (")  # every layout weighed, none left out


def test_offloading_comes_after_every_degree_on_the_gpus():
    two = plan_of(*SEVEN_B_LONG, "hardware.colocated=true")
    assert (two.mesh.sequence, two.config.learner.offload_checkpoints) == (2, False)
    forced = plan_of(*SEVEN_B_LONG, "hardware.colocated=true", "learner.sequence_parallel=1")
    assert forced.config.learner.offload_checkpoints is True  # one rank alone holds it only so
