"""Settings a switched-off feature ignores are refused before anything starts, one sentence each, naming the key and
how to turn the feature on; presets never set such keys, so a user who turns a preset's feature off is not blamed
for the preset's values."""

from __future__ import annotations

import dataclasses
from enum import Enum

import pytest
import yaml

from helpers import ALGO_NEEDS, plan_problems
from rlgen.config import RunConfig, get_key, set_key
from rlgen.config.compose import CONF_DIR, compose_run_config
from rlgen.plan import PlanError, build_plan
from rlgen.plan.checks.ignored import SWITCHES, governed


def test_a_lora_setting_with_lora_off_is_refused_with_the_fix():
    assert plan_problems(["learner.lora.enabled=false", "learner.lora.rank=8"]) == [
        "learner.lora.rank=8 has no effect with learner.lora.enabled=false; drop it or set learner.lora.enabled=true."]


@pytest.mark.parametrize(("overrides", "sentence"), [
    (["learner.lora.alpha=32"], "learner.lora.alpha=32.0 has no effect with learner.lora.enabled=false"),  # off: CPU
    (["wandb.project=mine"], "wandb.project=mine has no effect with wandb.mode=disabled; drop it or set wandb.mode="),
    (["eval.samples=4"], "eval.samples=4 has no effect with eval.every=0; drop it or set eval.every=20."),
    (["algo.max_gen_batches=6"], "algo.max_gen_batches=6 has no effect with algo.dynamic_sampling=false"),
    (["algo.kl_penalty=reward"], "algo.kl_penalty=reward has no effect with algo.kl_coef=0.0; drop it or set "
                                 "algo.kl_coef="),
])
def test_each_switch_refuses_what_it_ignores(overrides, sentence):
    problems = plan_problems(overrides)
    assert len(problems) == 1 and problems[0].startswith(sentence), problems


def _other(cfg, key: str):
    """A valid value for key that is not its default."""
    group, name = key.rsplit(".", 1)
    field = next(f for f in dataclasses.fields(get_key(cfg, group)) if f.name == name)
    value, kind = get_key(RunConfig(), key), str(field.type)
    if isinstance(value, bool):
        return not value
    if isinstance(value, Enum):
        return next(m for m in type(value) if m != value)
    if isinstance(value, list):
        return ["q_proj"]
    if "int" in kind:
        return (value or 0) + 4
    if "float" in kind:
        return (value or 0.0) + 0.25
    return "other"


@pytest.mark.parametrize(("switch", "key"), [(s, k) for s in SWITCHES for k in governed(s)],
                         ids=[k for s in SWITCHES for k in governed(s)])
def test_every_key_a_switch_governs_is_refused_while_it_is_off(switch, key):
    cfg = set_key(compose_run_config([]), switch.key, switch.off[0])
    cfg = set_key(cfg, key, _other(cfg, key))
    with pytest.raises(PlanError) as info:
        build_plan(cfg)
    assert [p for p in info.value.problems if p.startswith(f"{key}=")] == [
        next(p for p in info.value.problems if f"has no effect with {switch.key}=" in p)]
    build_plan(set_key(cfg, key, get_key(RunConfig(), key)))  # the default itself is not refused


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if k in ("defaults", "hydra"):
            continue
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) and k != "rewards" else {f"{prefix}{k}": v})
    return out


PRESETS = [*sorted(CONF_DIR.glob("*/*.yaml")), CONF_DIR / "config.yaml"]


@pytest.mark.parametrize("preset", PRESETS, ids=[p.relative_to(CONF_DIR).as_posix() for p in PRESETS])
def test_presets_leave_what_a_switch_governs_at_its_default(preset):
    group = "" if preset.parent == CONF_DIR else f"{preset.parent.name}."
    values = _flat(yaml.safe_load(preset.read_text()) or {}, group)
    defaults = RunConfig()
    for switch in SWITCHES:
        for key in governed(switch):
            if key in values:
                assert values[key] == get_key(defaults, key), f"{preset.name} sets {key}, which {switch.key} governs"


def test_turning_off_a_presets_feature_is_not_blamed_on_the_preset():
    plan = build_plan(compose_run_config(["algo=dapo", "algo.dynamic_sampling=false"]))
    assert plan.config.algo.dynamic_sampling is False


# -- settings the chosen estimator or loss does not read (Choice rules, from rlgen.algo.registry) -----------------


@pytest.mark.parametrize(("overrides", "sentence"), [
    (["algo=rloo", "algo.scale_rewards=batch"],
     "algo.scale_rewards=batch has no effect with algo.advantage=rloo, which does not read it; set "
     "algo.scale_rewards=group (its default) or choose an advantage estimator that reads it: algo.advantage=grpo."),
    (["algo=reinforce_pp", "algo.reward_std=unbiased"],
     "algo.reward_std=unbiased has no effect with algo.advantage=reinforce_pp, which does not read it; set "
     "algo.reward_std=population (its default) or choose an advantage estimator that reads it: algo.advantage=grpo."),
    # CISPO's ratio is per token whatever importance_level says: refused, not planned as "per sequence"
    (["algo=cispo", "algo.importance_level=sequence", "algo.loss_agg=seq_mean_token_mean"],
     "algo.importance_level=sequence has no effect with algo.policy_loss=cispo, which does not read it; set "
     "algo.importance_level=token (its default) or choose a policy loss that reads it: algo.policy_loss=ppo_clip."),
])
def test_a_setting_the_chosen_part_ignores_is_refused(overrides, sentence):
    assert plan_problems(overrides) == [sentence]


def test_the_sequence_is_fix_offered_to_cispo_is_one_it_reads():
    # tis_level=sequence under a per-token ratio: for cispo the fix is never importance_level=sequence (it ignores it)
    [problem] = plan_problems(["algo=cispo", "algo.tis_level=sequence"])
    assert "algo.policy_loss=cispo (a ratio per token)" in problem and "importance_level" not in problem
    build_plan(compose_run_config(["algo=cispo", "algo.tis_level=sequence", "algo.old_logprobs=trainer"]))


def _unread() -> list[tuple[str, str, str]]:
    """(the choosing key, a registered name, a setting that part does not read)."""
    from rlgen.algo.registry import CHOOSERS, part_reads

    return [(key, name, s) for key, table, settings in CHOOSERS for name in table for s in settings
            if not part_reads(key, name, s)]


@pytest.mark.parametrize(("key", "name", "setting"), _unread(), ids=[f"{n}-{s}" for _, n, s in _unread()])
def test_every_setting_a_registered_part_ignores_is_refused(key, name, setting):
    cfg = set_key(compose_run_config([]), key, name)
    if name == "cispo":
        cfg = set_key(cfg, "algo.clip_low", 1.0)
    changed = set_key(cfg, f"algo.{setting}", _other(cfg, f"algo.{setting}"))
    with pytest.raises(PlanError) as info:
        build_plan(changed)
    assert [p for p in info.value.problems if p.startswith(f"algo.{setting}=")] == [
        next(p for p in info.value.problems if f"has no effect with {key}={name}, which does not read it" in p)]
    build_plan(cfg)  # the default itself is not refused


def test_a_part_registered_without_reads_is_never_refused_for_them():
    from rlgen.algo.registry import register_advantage, unregister_advantage

    register_advantage("mine", "rlgen.algo.rloo:rloo_advantages")
    try:
        build_plan(compose_run_config(["algo.advantage=mine", "algo.scale_rewards=batch"]))
    finally:
        unregister_advantage("mine")
    register_advantage("mine", "rlgen.algo.rloo:rloo_advantages", reads=())
    try:
        assert plan_problems(["algo.advantage=mine", "algo.scale_rewards=batch"])[0].startswith(
            "algo.scale_rewards=batch has no effect with algo.advantage=mine")
    finally:
        unregister_advantage("mine")


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF_DIR / "algo").glob("*.yaml") if p.stem != "base_algo"))
def test_every_algo_preset_plans_with_what_its_parts_read(preset):
    build_plan(compose_run_config([f"algo={preset}", *ALGO_NEEDS.get(preset, [])]))
