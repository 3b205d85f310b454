"""The algorithm presets and loss options end to end on a local Ray cluster on CPU: the presets learn, dynamic
sampling drops constant groups and still fills the batch, NaN rewards are counted and do no harm, and the KL,
entropy and importance-sampling options run."""

from __future__ import annotations

import math

import pytest

from helpers import assert_learned
from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime.run import run_training

MIN_PRESET_GAIN = 0.1  # what each preset must learn by on the default task
pytestmark = pytest.mark.usefixtures("no_placement_group_left")  # the runs share one local cluster


def _run(tmp_path, overrides: list[str]):
    cfg = compose_run_config(["progress=false", *overrides])
    summary = run_training(build_plan(cfg), tmp_path)
    return cfg, read_jsonl(tmp_path / "metrics.jsonl"), summary


@pytest.mark.slow
@pytest.mark.long  # 150 steps each; the default (GRPO) run learns in make test (test_smoke_run_learns)
@pytest.mark.parametrize("preset", ["dapo", "gspo", "rloo", "reinforce_pp", "cispo"])
def test_preset_learns_on_the_default_task(preset, tmp_path):
    cfg, records, summary = _run(tmp_path, [f"algo={preset}"])
    assert cfg.algo.kind == preset
    assert len(records) == cfg.steps
    assert_learned(records, summary, min_gain=MIN_PRESET_GAIN)
    if preset == "dapo":  # the default task has groups all right or all wrong: dynamic sampling replaced them
        assert sum(r["dynamic/groups_dropped"] for r in records) > 0
        assert sum(r["dynamic/rounds"] > 1 for r in records) > 0


def test_dynamic_sampling_drops_constant_groups_and_fills_the_batch(tmp_path):
    # half the prompts (even answers) score 0.5 whatever is sampled: their groups carry no signal
    cfg, records, _ = _run(tmp_path, ["algo=dapo", "task.reward=helpers:even_answers_half", "steps=4",
                                      "algo.prompts_per_step=16", "algo.max_gen_batches=6", "algo.async_steps=1",
                                      "algo.mask_truncated=false"])
    want = cfg.algo.prompts_per_step
    for r in records:
        assert r["dynamic/groups_dropped"] >= 1
        assert r["dynamic/rounds"] >= 2
        assert r["dynamic/groups_kept"] == want
        assert r["sequences"] == want * cfg.algo.samples_per_prompt  # full batch on the learner
        assert r["dynamic/extra_tokens"] > 0
    assert max(r["staleness"] for r in records) <= 1


def test_nan_rewards_get_zero_advantage_and_are_counted(tmp_path, capsys):
    cfg, records, _ = _run(tmp_path, ["task.reward=helpers:nan_on_even_answers", "steps=3"])
    assert all(r["reward/nan"] > 0 for r in records)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["reward_mean"]) for r in records)
    assert not any(r["skipped"] for r in records)
    assert "rewards were NaN; those completions get advantage 0" in capsys.readouterr().out


@pytest.mark.parametrize("overrides", [
    ["algo.kl_coef=0.05", "algo.kl_penalty=reward", "algo.kl_estimator=k1"],
    ["algo.kl_coef=0.05", "algo.kl_estimator=k2", "algo.kl_bias_correction=true"],
    ["algo.entropy_coef=0.01", "algo.entropy_top_frac=0.2", "algo.tis_level=sequence", "algo.tis_mode=mask",
     "algo.old_logprobs=trainer"],
    # the two presets' options: their math is in tests/unit; make test-all also runs them end to end
    pytest.param(["algo=reinforce_pp", "algo.advantage=reinforce_pp_baseline", "algo.seq_mask_cap=2"],
                 marks=pytest.mark.long),
    pytest.param(["algo=dr_grpo", "algo.scale_rewards=batch", "algo.reward_std=unbiased"], marks=pytest.mark.long),
], ids=["kl-in-reward", "kl-k2-bias-corrected", "entropy-and-sequence-is", "reinforce-pp-baseline",
     "dr-grpo-batch-std"])
def test_loss_options_run(overrides, tmp_path):
    cfg, records, _ = _run(tmp_path, [*overrides, "steps=3"])
    assert len(records) == 3
    for r in records:
        assert math.isfinite(r["loss"]) and not r["skipped"]
    if cfg.algo.kl_coef > 0:
        assert all(math.isfinite(r["kl"]) and r["kl"] >= 0 for r in records if cfg.algo.kl_estimator != "k1")
        assert "kl" in records[-1]
    if cfg.algo.kl_penalty == "reward":
        assert all("kl_reward_penalty" in r for r in records)


def test_reinforce_pp_trains_with_one_sample_a_prompt(tmp_path):
    # REINFORCE++ whitens over the batch and needs no groups: a batch of one sample a prompt trains
    cfg, records, _ = _run(tmp_path, ["algo=reinforce_pp", "algo.samples_per_prompt=1", "steps=2"])
    assert cfg.algo.samples_per_prompt == 1 and len(records) == 2
    for r in records:
        assert r["sequences"] == cfg.algo.prompts_per_step
        assert math.isfinite(r["loss"]) and not r["skipped"] and r["grad_norm"] > 0
