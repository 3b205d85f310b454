"""Configs that cannot run: each fails before anything launches, with a message that says what to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlgen.config.compose import ConfigError, compose_run_config
from rlgen.plan import PlanError, build_plan

# (id, overrides, fragments every one of which some problem must contain, how many problems in all)
# "{tmp}" in an override is replaced by the test's tmp_path.
PLAN_ERRORS = [
    (
        # engine kinds are a registry (rlgen.engines.registry), so an unknown one is the plan's to refuse
        "unknown-engine-kind",
        ["engine.kind=sglang"],
        ["engine.kind=sglang is not an engine kind; choose one of: hf, remote, vllm"],
        1,
    ),
    (
        "unknown-algorithm",
        ["algo.kind=ppo2"],
        ["algo.kind=ppo2 is not an algorithm preset; choose one of: cispo, dapo, distill, dr_grpo, grpo, gspo, "
         "reinforce_pp, rloo (pick one with algo=<name>"],
        1,
    ),
    (
        # the maths are two registries (rlgen.algo.registry): each unknown name is one sentence with the choices
        "unknown-advantage-and-loss",
        ["algo.advantage=ppo", "algo.policy_loss=sapo"],
        ["algo.advantage=ppo is not an advantage estimator; choose one of: grpo, reinforce_pp, "
         "reinforce_pp_baseline, rloo", "algo.policy_loss=sapo is not a policy loss; choose one of: cispo, ppo_clip"],
        2,
    ),
    (
        "sequence-tis-under-token-ratio",
        ["algo.tis_level=sequence"],
        ["algo.tis_level=sequence with algo.importance_level=token and algo.old_logprobs=engine is not "
         "sequence-level IS", "or algo.tis_level=token"],
        1,
    ),
    (
        "k1-kl-in-the-loss",
        ["algo.kl_coef=0.01", "algo.kl_estimator=k1"],
        ["algo.kl_estimator=k1 in the loss has zero expected gradient", "algo.kl_penalty=reward"],
        1,
    ),
    (
        "clip-low-1-outside-cispo",
        ["algo.clip_low=1.0"],
        ["algo.clip_low=1.0 must be in [0, 1)", "only the cispo policy loss takes >= 1"],
        1,
    ),
    (
        "sequence-ratio-with-token-mean",
        ["algo=gspo", "algo.loss_agg=token_mean"],
        ["algo.importance_level=sequence gives each sequence one ratio", "set algo.loss_agg=seq_mean_token_mean"],
        1,
    ),
    (
        "dynamic-sampling-cap-0",
        ["algo=dapo", "algo.max_gen_batches=0"],
        ["algo.max_gen_batches=0: dynamic sampling needs at least 1 generation round"],
        1,
    ),
    (
        "reward-weights-all-zero",
        ["+task.rewards.exact_match=0", "+task.rewards.char_match=0"],
        ["task.rewards.exact_match=0 and task.rewards.char_match=0: every weight is 0",
         "++task.rewards.exact_match=1.0"],
        1,
    ),
    (
        "entropy-top-frac-0",
        ["algo.entropy_top_frac=0"],
        ["algo.entropy_top_frac=0.0 must be in (0, 1]"],
        1,
    ),
    (
        "overlong-buffer-past-the-limit",
        ["algo=dapo", "algo.max_new_tokens=8", "algo.overlong_buffer=8"],
        ["algo.overlong_buffer=8 must be less than algo.max_new_tokens=8"],
        1,
    ),
    (
        "vllm-on-cpu",
        ["engine=vllm", "hardware=cpu"],
        ["engine=vllm needs CUDA GPUs, but hardware=cpu has none", "use engine=hf on CPU"],
        1,
    ),
    (
        "tp4-on-2xh200",
        ["engine=vllm_tp4", "hardware=2xh200"],
        ["tensor_parallel_size=4 is larger than a node (2 GPUs)", "use tensor_parallel_size <= 2"],
        1,
    ),
    (
        "tp-not-dividing-engine-gpus",
        [
            "hardware=8xh100",
            "hardware.engine_gpus=3",
            "hardware.learner_gpus=5",
            "engine=vllm_tp2",
            "algo.prompts_per_step=5",
        ],
        ["engine.tensor_parallel_size=2 does not divide the 3 engine GPUs of hardware=8xh100"],
        1,
    ),
    (
        "gpus-do-not-add-up",
        ["engine=vllm", "hardware=8xh100", "hardware.engine_gpus=4", "hardware.learner_gpus=2"],
        ["GPUs do not add up", "= 6, but hardware=8xh100 has 8", "make them add up to 8"],
        1,
    ),
    (
        "too-many-engines",
        ["engine=vllm", "hardware=8xh100", "engine.num_engines=5", "hardware.colocated=false", "hardware.engine_gpus=4", "hardware.learner_gpus=4"],
        [
            "engine.num_engines=5 with tensor_parallel_size=1 needs 5 GPUs, but only 4",
            "set engine.num_engines<=4",
        ],
        1,
    ),
    (
        "too-many-tp2-engines",
        ["engine=vllm_tp2", "hardware=8xh100", "engine.num_engines=3", "hardware.colocated=false", "hardware.engine_gpus=4", "hardware.learner_gpus=4"],
        ["needs 6 GPUs, but only 4", "set engine.num_engines<=2"],
        1,
    ),
    ("zero-engines", ["engine.num_engines=0"], ["engine.num_engines=0 must be at least 1, or null"], 1),
    (
        "batch-smaller-than-learner-ranks",
        ["engine=vllm", "hardware=8xh100", "algo.prompts_per_step=1", "algo.samples_per_prompt=2", "hardware.colocated=false", "hardware.engine_gpus=4", "hardware.learner_gpus=4"],
        ["the batch of 2 sequences", "cannot give each of 4 learner ranks a sequence", "algo.prompts_per_step to 2"],
        1,
    ),
    (
        "micro-batch-below-the-longest-row",
        ["algo.micro_batch_tokens=10", "algo.max_new_tokens=8"],
        ["algo.micro_batch_tokens=10 cannot hold the longest row", "= 16 tokens", "raise it to 16 or more"],
        1,
    ),
    (
        "max-model-len-too-small",
        ["engine.max_model_len=10"],
        ["engine.max_model_len=10 cannot hold", "= 12", "set engine.max_model_len>=12"],
        1,
    ),
    (
        "sequence-beyond-position-embeddings",
        ["algo.max_new_tokens=600", "engine.max_model_len=4096"],  # past YaRN x4 over the 128 too
        ["task.max_prompt_tokens=8 + algo.max_new_tokens=600 = 608 tokens per sequence",
         "max_position_embeddings=128", "lower algo.max_new_tokens or task.max_prompt_tokens"],
        1,
    ),
    (
        # the prompt side is the larger part: the sentence says so first (a long-prompt data set, default model)
        "long-prompts-beyond-position-embeddings",
        ["task.max_prompt_tokens=600", "engine.max_model_len=4096"],
        ["task.max_prompt_tokens=600 + algo.max_new_tokens=4 = 604 tokens per sequence",
         "lower task.max_prompt_tokens (or shorten the prompts) or algo.max_new_tokens"],
        1,
    ),
    (
        "model-too-big-for-gpu",
        ["engine=vllm", "hardware=8xh100", "model=qwen2_5_7b", "engine.gpu_memory_utilization=0.1"],
        ["model qwen2_5_7b (7.62B params", "does not fit in 7.5 GiB", "raise engine.tensor_parallel_size"],
        1,
    ),
    (
        "learner-too-big-for-one-gpu",  # 7B weights, fp32 master and AdamW states: ~100 GiB on one rank
        ["engine=vllm", "hardware=2xh200", "model=qwen2_5_7b", "learner.lora.enabled=false",  # (unset: LoRA)
         "hardware.colocated=false"],
        ["a learner rank needs about 147 GiB at its peak", "optimizer 85.1", "more learner GPUs with "
         "learner.zero_stage=3", "LoRA adapters on the frozen base (learner.lora.enabled=true)"],
        1,
    ),
    (
        "colocated-engine-share-too-large",  # the learner holds ~24 GiB (with the IPC buffer) of the H100 between steps
        ["engine=vllm", "hardware=1xh100", "model=qwen2_5_1_5b", "engine.gpu_memory_utilization=0.9"],
        ["engine.gpu_memory_utilization=0.9 asks for 67.1 GiB", "learner already holds about 24.0 GiB",
         "the plan derives 0.50"],
        1,
    ),
    (
        "colocated-7b-on-one-gpu",
        ["engine=vllm", "hardware=1xh100", "model=qwen2_5_7b", "learner.lora.enabled=false"],  # (unset: LoRA)
        ["a learner rank needs about 148 GiB", "leaves the engine 0.0 GiB", "give engines their own GPUs"],
        2,
    ),
    (
        "gpu-memory-utilization-zero",
        ["engine.gpu_memory_utilization=0"],
        ["engine.gpu_memory_utilization=0.0 must be in (0, 1]"],
        1,
    ),
    (
        "colocated-without-sleep-mode",
        ["engine=vllm", "hardware=1xh100", "engine.enable_sleep_mode=false", "algo.async_steps=0"],
        ["needs vLLM sleep mode", "set engine.enable_sleep_mode=true"],
        1,
    ),
    (
        "colocate-on-cpu",
        ["engine.colocate=true"],
        ["engine.colocate=true shares learner GPUs, but hardware=cpu has none"],
        1,
    ),
    (
        "samples-per-prompt-1",
        ["algo.samples_per_prompt=1"],
        ["algo.samples_per_prompt=1: algo.advantage=grpo compares the samples of a prompt, so it needs at least 2"],
        1,
    ),
    (
        # REINFORCE++ whitens over the batch and takes one sample a prompt, but dynamic sampling needs groups
        "one-sample-with-dynamic-sampling",
        ["algo=reinforce_pp", "algo.samples_per_prompt=1", "algo.dynamic_sampling=true"],
        ["algo.dynamic_sampling=true drops every group whose rewards are all equal, and with "
         "algo.samples_per_prompt=1 every group is one reward"],
        1,
    ),
    ("no-samples", ["algo=reinforce_pp", "algo.samples_per_prompt=0"], ["algo.samples_per_prompt=0 must be at least 1"],
     1),
    ("top-p-zero", ["algo.top_p=0"], ["algo.top_p=0.0 must be in (0, 1]"], 1),
    ("negative-async-steps", ["algo.async_steps=-1"], ["algo.async_steps=-1 must be >= 0"], 1),
    ("tis-cap-below-1", ["algo.tis_cap=0.5"], ["algo.tis_cap=0.5 must be 0 (off) or >= 1"], 1),
    ("zero-steps", ["steps=0"], ["steps=0 must be at least 1"], 1),
    ("jsonl-without-path", ["task=jsonl"], ["task=jsonl needs a file: set task.path="], 1),
    (
        "unknown-reward",
        ["task.reward=exact_matc"],
        ["task.reward='exact_matc' is not a known reward", "exact_match"],
        1,
    ),
    (
        "unloadable-reward",
        ["task.reward=no_such_module_for_rlgen:score"],
        ["cannot be loaded", "no_such_module_for_rlgen"],
        1,
    ),
    (
        "hf-with-tp2-on-gpus",
        ["hardware=8xh100", "engine.tensor_parallel_size=2"],
        ["engine=hf does not shard across GPUs", "engine=vllm_tp2"],
        1,
    ),
    ("tp-on-cpu", ["engine.tensor_parallel_size=2"], ["needs GPUs; on hardware=cpu set it to 1"], 1),
    (
        "heads-not-divisible-by-tp",
        ["engine=vllm_tp4", "hardware=8xh100", "model=qwen2_5_0_5b"],
        ["14 attention heads", "tensor_parallel_size=4"],
        1,
    ),
    (
        # a GPU preset without GPUs: one sentence that names the setting, not the engine's or colocation's complaint
        "gpus-per-node-zero-on-a-gpu-preset",
        ["engine=vllm", "hardware=1xh100", "hardware.gpus_per_node=0"],
        ["hardware.gpus_per_node=0 leaves hardware=1xh100 without its H100-SXM-80GB GPUs; set "
         "hardware.gpus_per_node to the GPUs each node has, or use hardware=cpu"],
        1,
    ),
    ("gpus-per-node-negative", ["hardware.gpus_per_node=-1"], ["hardware.gpus_per_node=-1 must be >= 0"], 1),
    ("no-nodes", ["hardware.nodes=0"], ["hardware.nodes=0 must be at least 1."], 1),
    (
        "no-learner-gpus",
        ["engine=vllm", "hardware=8xh100", "hardware.engine_gpus=8", "hardware.learner_gpus=0"],
        ["hardware.learner_gpus=0: learners need at least one GPU"],
        1,
    ),
    (
        "tp-group-would-span-nodes",
        [
            "engine=vllm_tp4",
            "hardware=2x8xh100",
            "hardware.gpus_per_node=6",
            "hardware.engine_gpus=8",
            "hardware.learner_gpus=4",
        ],
        ["node 0 would hold 6 engine GPUs", "not a whole number of TP-4 groups"],
        1,
    ),
]

CONFIG_ERRORS = [
    (
        "unknown-key",
        ["engine.max_modl_len=5"],
        ["engine.max_modl_len is not a setting of engine", "max_model_len"],
    ),
    (
        "unknown-nested-key",
        ["hardware.gpu.memory=80"],
        ["hardware.gpu.memory is not a setting of hardware.gpu", "memory_gb"],
    ),
    ("unknown-group-option", ["engine=vllm_tp3"], ["engine=vllm_tp3 is not in conf/engine/", "vllm_tp2"]),
    ("unknown-algorithm-preset", ["algo=ppo"], ["algo=ppo is not in conf/algo/", "dapo", "gspo"]),
    ("bad-importance-level", ["algo.importance_level=seq"], ["algo.importance_level", "token", "sequence"]),
    ("unknown-hardware", ["hardware=16xh100"], ["hardware=16xh100 is not in conf/hardware/", "2x8xh100"]),
    ("wrong-value-type", ["algo.lr=fast"], ["algo.lr=fast", "could not be converted to Float"]),
    ("float-for-int", ["algo.prompts_per_step=1.5"], ["algo.prompts_per_step=1.5", "Integer"]),
    ("bad-bool", ["engine.enable_sleep_mode=maybe"], ["engine.enable_sleep_mode=maybe", "not a valid bool"]),
    ("bad-loss-agg", ["algo.loss_agg=mean"], ["algo.loss_agg=mean", "seq_mean_token_mean"]),
    ("null-for-required", ["engine.kind=null"], ["engine.kind", "not Optional"]),
]


def _fill(overrides: list[str], tmp_path: Path) -> list[str]:
    return [o.replace("{tmp}", str(tmp_path)) for o in overrides]


def test_corpus_is_large_and_distinct():
    assert len(PLAN_ERRORS) + len(CONFIG_ERRORS) >= 15
    ids = [c[0] for c in PLAN_ERRORS + CONFIG_ERRORS]
    assert len(set(ids)) == len(ids)
    overrides = [tuple(c[1]) for c in PLAN_ERRORS + CONFIG_ERRORS]
    assert len(set(overrides)) == len(overrides)


@pytest.mark.parametrize(
    ("overrides", "fragments", "count"), [c[1:] for c in PLAN_ERRORS], ids=[c[0] for c in PLAN_ERRORS]
)
def test_plan_error(overrides, fragments, count, tmp_path):
    cfg = compose_run_config(_fill(overrides, tmp_path))  # composes fine: the problem spans fields
    with pytest.raises(PlanError) as info:
        build_plan(cfg)
    problems = info.value.problems
    for fragment in fragments:
        assert any(fragment in p for p in problems), f"no problem mentions {fragment!r}: {problems}"
    assert len(problems) == count, problems
    for p in problems:
        assert "\n" not in p and p.endswith("."), f"each problem is one sentence: {p!r}"
    assert str(info.value) == "\n".join(problems)


@pytest.mark.parametrize(
    ("overrides", "fragments"), [c[1:] for c in CONFIG_ERRORS], ids=[c[0] for c in CONFIG_ERRORS]
)
def test_config_error(overrides, fragments):
    with pytest.raises(ConfigError) as info:
        compose_run_config(overrides)
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    assert "\n" not in msg, "a config error is one line"
    assert isinstance(info.value, ValueError)
    assert info.value.__cause__ is not None  # the Hydra/OmegaConf error stays attached for debugging


def test_several_problems_are_all_reported():
    cfg = compose_run_config(
        [
            "algo.samples_per_prompt=1",
            "algo.top_p=0",
            "algo.async_steps=-1",
            "algo.tis_cap=0.5",
            "engine.max_model_len=10",
            "task.reward=nope",
        ]
    )
    with pytest.raises(PlanError) as info:
        build_plan(cfg)
    problems = info.value.problems
    expected = [
        "algo.samples_per_prompt=1",
        "algo.top_p=0.0",
        "algo.async_steps=-1",
        "algo.tis_cap=0.5",
        "engine.max_model_len=10",
        "task.reward='nope'",
    ]
    assert len(problems) == len(expected), problems
    for fragment in expected:
        assert sum(fragment in p for p in problems) == 1, f"{fragment!r} should appear in exactly one problem"


def test_placement_and_scalar_problems_are_reported_together():
    cfg = compose_run_config(
        [
            "engine=vllm_tp2",
            "hardware=8xh100",
            "hardware.engine_gpus=3",
            "hardware.learner_gpus=5",
            "algo.prompts_per_step=1",
            "algo.samples_per_prompt=4",
            "algo.top_p=2",
        ]
    )
    with pytest.raises(PlanError) as info:
        build_plan(cfg)
    joined = "\n".join(info.value.problems)
    assert "does not divide the 3 engine GPUs" in joined
    assert "cannot give each of 5 learner ranks a sequence" in joined  # learners are still placed and checked
    assert "algo.top_p=2.0 must be in (0, 1]" in joined
    assert len(info.value.problems) == 3


def test_memory_check_passes_with_tensor_parallelism():
    # The 7B model that does not fit one GPU at 0.1 utilisation fits once sharded over 4 GPUs at 0.5.
    cfg = compose_run_config(
        ["engine=vllm_tp4", "hardware=8xh100", "model=qwen2_5_7b", "engine.gpu_memory_utilization=0.5",
         "hardware.colocated=false", "hardware.engine_gpus=4", "hardware.learner_gpus=4"]
    )
    plan = build_plan(cfg)
    assert [e.gpus for e in plan.engines] == [(0, 1, 2, 3)]


def test_tp_span_hint_suggests_a_multiple_of_tp():
    import re

    cfg = compose_run_config(
        [
            "engine=vllm_tp4",
            "hardware=2x8xh100",
            "hardware.gpus_per_node=6",
            "hardware.engine_gpus=8",
            "hardware.learner_gpus=4",
        ]
    )
    with pytest.raises(PlanError) as info:
        build_plan(cfg)
    m = re.search(r"\(e\.g\. (\d+)\)", info.value.problems[0])
    assert m is not None
    suggested = int(m.group(1))
    assert suggested > 0 and suggested % 4 == 0


@pytest.mark.parametrize("override", ["hardware=8", "engine=null"])
def test_non_string_group_value_is_a_config_error(override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        compose_run_config([override])
