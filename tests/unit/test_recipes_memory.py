"""Values a config leaves null come from the model size's recipe or from the plan's memory arithmetic, each
with its source; a value set in the config always wins."""

from __future__ import annotations

import json

import pytest

from rlgen.config import set_key
from rlgen.config.compose import compose_run_config
from rlgen.plan import PlanError, build_plan
from rlgen.plan.build import count_params
from rlgen.plan.memory import GIB, learner_memory
from rlgen.plan.recipes import RECIPES, recipe_for


def plan_of(*overrides):
    return build_plan(compose_run_config(list(overrides)))


def settings(plan) -> dict[str, tuple[object, str]]:
    return {s.key: (s.value, s.source) for s in plan.settings}


def test_the_embedded_default_keeps_its_tiny_values():
    plan = plan_of()
    s = settings(plan)
    assert s["algo.max_new_tokens"][0] == 4 and s["algo.lr"][0] == 1e-3 and s["algo.micro_batch_tokens"][0] == 0
    assert s["algo.lr"][1].startswith("recipe tiny")
    cfg = plan.config
    assert (cfg.algo.max_new_tokens, cfg.algo.lr, cfg.algo.micro_batch_tokens) == (4, 1e-3, 0)
    assert plan.memory is None  # CPU


@pytest.mark.parametrize(("model", "band", "new_tokens", "micro", "engine_share"), [
    ("qwen2_5_0_5b", "0.5B", 512, 32768, 0.7),
    ("qwen2_5_1_5b", "1.5B", 1024, 32768, 0.5),
])
def test_one_h100_colocated_gets_the_recipe_and_a_derived_split(model, band, new_tokens, micro, engine_share):
    plan = plan_of("engine=vllm", "hardware=1xh100", f"model={model}", "algo.async_steps=0", "engine.engines_per_gpu=1")
    s = settings(plan)
    assert s["algo.max_new_tokens"] == (new_tokens, s["algo.max_new_tokens"][1])
    assert s["algo.lr"][0] == 1e-6 and s["algo.lr"][1].startswith(f"recipe {band}")
    assert s["learner.gradient_checkpointing"][0] is True and s["learner.zero_stage"][0] == 2
    assert s["algo.micro_batch_tokens"][0] == micro and s["algo.micro_batch_tokens"][1].startswith("derived")
    assert s["engine.gpu_memory_utilization"][0] == engine_share
    m = plan.memory
    assert m.colocated and m.engine_fraction == engine_share
    # awake: the engine's share and the idle learner fit in 85% of the GPU; training: the peak fits beside a
    # sleeping engine
    assert m.engine_fraction * m.gpu_gib + m.learner_idle_gib <= 0.85 * m.gpu_gib
    assert m.learner_peak_gib + 2.0 <= 0.92 * m.gpu_gib


@pytest.mark.parametrize("model", ["qwen2_5_0_5b", "qwen2_5_1_5b"])
def test_colocated_async_keeps_the_engine_awake_beside_the_learners_peak(model):
    asleep = plan_of("engine=vllm", "hardware=1xh100", f"model={model}", "algo.async_steps=0")
    awake = plan_of("engine=vllm", "hardware=1xh100", f"model={model}", "algo.async_steps=1")
    assert awake.engines_awake and not asleep.engines_awake
    assert plan_of("engine=vllm", "hardware=1xh100", f"model={model}").engines_awake  # the default where it fits
    m = awake.memory
    assert m.colocated and m.engine_awake
    # the whole engine and the learner at its peak fit 85% of the GPU at once, so the engine gets less than asleep
    assert m.engine_fraction * m.gpu_gib + m.learner_peak_gib <= 0.85 * m.gpu_gib
    assert 0 < m.engine_fraction < asleep.memory.engine_fraction
    assert settings(awake)["engine.gpu_memory_utilization"][1].startswith("derived: what the learner's peak")


def test_colocated_async_refuses_an_engine_share_that_crowds_out_the_learner():
    with pytest.raises(PlanError) as err:
        plan_of("engine=vllm", "hardware=1xh100", "model=qwen2_5_1_5b", "algo.async_steps=1",
                "engine.gpu_memory_utilization=0.9")
    text = str(err.value)  # 0.9 is more than the 85% both may use: the share alone is refused, no negative figure
    assert text.startswith("engine.gpu_memory_utilization=0.9 keeps about 67 GiB of each 80 GB GPU while the "
                           "learner trains") and "algo.async_steps=0" in text
    with pytest.raises(PlanError) as err:  # 0.8 leaves the learner some room, but not its peak
        plan_of("engine=vllm", "hardware=1xh100", "model=qwen2_5_1_5b", "algo.async_steps=1",
                "engine.gpu_memory_utilization=0.8")
    text = str(err.value)
    assert "beside an awake engine" in text and "a lower engine.gpu_memory_utilization (now 0.8)" in text
    assert "algo.async_steps=0" in text
    # without sleep mode an awake engine is fine; a sleeping one is not
    assert plan_of("engine=vllm", "hardware=1xh100", "model=qwen2_5_0_5b", "algo.async_steps=1",
                   "engine.enable_sleep_mode=false").engines_awake
    with pytest.raises(PlanError, match="needs vLLM sleep mode"):
        plan_of("engine=vllm", "hardware=1xh100", "model=qwen2_5_0_5b", "engine.enable_sleep_mode=false",
                "algo.async_steps=0")


def test_async_steps_left_null_overlaps_where_it_fits_and_says_why():
    def chosen(*overrides):
        plan = plan_of(*overrides)
        value, source = settings(plan)["algo.async_steps"]
        assert plan.async_steps == value and source.startswith("derived")
        return value, source

    assert chosen()[0] == 0  # CPU, hf engines: on-policy
    assert chosen("engine=vllm", "hardware=2xh200")[0] == 1  # split GPUs
    assert chosen("engine=vllm", "hardware=1xh100", "model=qwen2_5_1_5b")[0] == 1  # colocated, both fit
    # 1.5B with micro-batches of 96k tokens: the learner's peak leaves an awake engine too little, so the engine
    # sleeps while the learner trains
    big = ("engine=vllm", "hardware=1xh100", "model=qwen2_5_1_5b", "algo.micro_batch_tokens=98304")
    value, source = chosen(*big)
    assert value == 0 and "do not both fit" in source
    with pytest.raises(PlanError, match="beside an awake engine.*algo.async_steps=0"):
        plan_of(*big, "algo.async_steps=1")
    assert plan_of("engine=vllm", "hardware=1xh100", "algo.async_steps=0").async_steps == 0  # a set value wins


def test_set_values_win_and_say_so():
    plan = plan_of("engine=vllm", "hardware=1xh100", "model=qwen2_5_0_5b", "algo.lr=3e-6",
                   "engine.gpu_memory_utilization=0.3", "algo.micro_batch_tokens=4096")
    s = settings(plan)
    assert s["algo.lr"] == (3e-6, "config")
    assert s["engine.gpu_memory_utilization"] == (0.3, "config")
    assert s["algo.micro_batch_tokens"] == (4096, "config")
    assert s["algo.max_new_tokens"][0] == 512  # the rest still from the recipe


def test_engines_on_their_own_gpus_keep_vllms_default():
    s = settings(plan_of("engine=vllm", "hardware=2xh200", "model=qwen2_5_1_5b", "hardware.colocated=false"))
    assert s["engine.gpu_memory_utilization"][0] == 0.9 and "own GPUs" in s["engine.gpu_memory_utilization"][1]


def test_a_model_folder_gets_the_recipe_of_its_size(tmp_path):
    # the shape of Qwen2.5-7B in a local folder: only config.json is read by the plan
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
        "tie_word_embeddings": False}))
    s = settings(plan_of("engine=vllm", "hardware=8xh100", f"model.path={tmp_path}"))
    assert s["learner.zero_stage"][0] == 3 and s["learner.zero_stage"][1].startswith("recipe 7B (7.62B params)")
    assert s["algo.micro_batch_tokens"][0] == 16384  # the 7B recipe's ceiling: it fits


def test_recipe_bands_cover_every_size_in_order():
    assert [r.name for r in RECIPES] == ["tiny", "small", "0.5B", "1.5B", "7B", "large"]
    assert recipe_for(80_000).name == "tiny"
    assert recipe_for(count_params(compose_run_config(["model=small"]).model)[0]).name == "small"
    for preset, band in (("qwen2_5_0_5b", "0.5B"), ("qwen2_5_1_5b", "1.5B"), ("qwen2_5_7b", "7B")):
        assert recipe_for(count_params(compose_run_config([f"model={preset}"]).model)[0]).name == band
    assert recipe_for(70e9).name == "large"


def test_learner_memory_by_hand():
    """1.5B, one rank, ZeRO-2, gradient checkpointing, micro-batches of 8,256 packed tokens."""
    cfg = build_plan(compose_run_config(["engine=vllm", "hardware=1xh100", "model=qwen2_5_1_5b"])).config
    p, vocab = count_params(cfg.model)
    m = learner_memory(cfg, p, vocab, ranks=1, tokens=8 * 1032)
    assert m.weights == pytest.approx(2 * p / GIB)
    assert m.optimizer == pytest.approx(12 * p / GIB)  # fp32 master + AdamW's two moments
    assert m.gradients == pytest.approx(6 * p / GIB)  # bf16 grads + the fp32 partition (one rank: all of it)
    assert m.logits == pytest.approx(883 * vocab * 4 * 4 / GIB)  # one chunk of the LM head: 883 tokens
    h, i, layers = 1536, 8960, 28
    assert m.activations == pytest.approx(8 * 1032 * (layers * 2 * h + 2 * (12 * h + 3 * i)) / GIB)
    z3 = learner_memory(set_key(cfg, "learner.zero_stage", 3), p, vocab, ranks=4, tokens=8 * 1032)
    assert z3.weights == pytest.approx(2 * p / 4 / GIB) and z3.optimizer == pytest.approx(3 * p / GIB)


def test_a_learner_that_cannot_fit_names_the_fixes():
    with pytest.raises(PlanError) as err:
        plan_of("engine=vllm", "hardware=2xh200", "model=qwen2_5_7b", "learner.lora.enabled=false",
                "hardware.colocated=false")
    (problem,) = err.value.problems
    assert "a learner rank needs about 147 GiB" in problem and "more learner GPUs with learner.zero_stage=3" in problem
    with pytest.raises(PlanError) as err:
        plan_of("engine=vllm", "hardware=2xh200", "model=qwen2_5_1_5b", "algo.micro_batch_tokens=524288",
                "learner.gradient_checkpointing=false", "algo.max_new_tokens=2048")
    text = " ".join(err.value.problems)
    assert "learner.gradient_checkpointing=true" in text and "use algo.micro_batch_tokens=22528" in text
    assert plan_of("engine=vllm", "hardware=2xh200", "model=qwen2_5_1_5b", "algo.micro_batch_tokens=22528",
                   "learner.gradient_checkpointing=false", "algo.max_new_tokens=2048")  # the fix it names fits


def test_the_micro_batch_budget_is_in_tokens_and_holds_the_longest_row():
    def budget(*overrides):
        (setting,) = [s for s in plan_of(*overrides).settings if s.key == "algo.micro_batch_tokens"]
        return setting

    one = budget("engine=vllm", "hardware=4xh100", "model=qwen2_5_1_5b", "hardware.colocated=true")
    assert one.value == 32768 and "from the longest row (1032) up to recipe 1.5B's 32768" in one.source
    # a row longer than the recipe's ceiling: the budget grows to hold it (a row is never split)
    long = budget("engine=vllm", "hardware=2xh200", "model=qwen2_5_7b", "algo.max_new_tokens=16384",
                  "algo.prompts_per_step=4")
    assert long.value == 17408 and long.value % 1024 == 0 and long.value >= 16384 + 8
    # on CPU, the recipe's: tiny trains a rank's rows in one micro-batch
    assert budget().value == 0 and budget("model=qwen2_5_0_5b").value == 32768
