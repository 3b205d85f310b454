"""Single values the plan refuses before anything starts: every float of the schema that is nan or infinite, steps
past any run's length, learning rates and temperatures out of range, and reward weights that are all 0. Each
refusal names only the value that is wrong, and the fix it gives is a form the command line accepts."""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest

from helpers import plan_problems
from rlgen.config import RunConfig, set_key
from rlgen.config.compose import compose_run_config
from rlgen.plan import PlanError, build_plan


def _float_keys(obj, prefix=""):
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _float_keys(value, f"{prefix}{f.name}.")
        elif isinstance(value, float) or (value is None and "float" in str(f.type)):
            yield prefix + f.name


FLOAT_KEYS = [k for k in _float_keys(RunConfig()) if not k.startswith("serve.")]  # rlgen serve's own checks judge those
MAX_STEPS = 10_000_000  # the bound README.md documents


@functools.cache
def _default():
    return compose_run_config([])


def test_the_walk_sees_the_floats_that_matter():
    assert {"algo.lr", "algo.temperature", "algo.kl_coef", "timeout_s", "eval.temperature", "learner.lora.alpha",
            "hardware.gpu.memory_gb"} <= set(FLOAT_KEYS)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_that_is_not_finite_gets_one_sentence(key, value):
    cfg = set_key(_default(), key, float(value))
    with pytest.raises(PlanError) as info:
        build_plan(cfg)
    assert info.value.problems == [f"{key}={value} is not a finite number; give a finite one, or leave it out for "
                                   "the default."]


@pytest.mark.parametrize("overrides", [["algo.lr=nan"], ["algo.temperature=nan"], ["+task.rewards.exact_match=inf"],
                                       ["hardware=1xh100", "engine=vllm", "hardware.gpu.memory_gb=nan"]])
def test_nan_and_inf_from_the_command_line_are_refused(overrides):
    key = overrides[-1].lstrip("+").split("=")[0]
    problems = plan_problems(overrides)
    assert len(problems) == 1 and problems[0].startswith(f"{key}=") and "is not a finite number" in problems[0]


def test_steps_past_any_run_are_refused_and_the_bound_itself_is_not():
    assert plan_problems([f"steps={MAX_STEPS + 1}"]) == [
        f"steps={MAX_STEPS + 1} is more than the 10,000,000 a run may take (at 0.1 s a step, ten million steps take "
        "12 days); give the number of steps to train, e.g. steps=1000."]
    assert build_plan(compose_run_config([f"steps={MAX_STEPS}"])).config.steps == MAX_STEPS


@pytest.mark.parametrize(("override", "phrase"), [
    ("algo.lr=2", "algo.lr=2.0 must be less than 1"),
    ("algo.temperature=50", "algo.temperature=50.0 is more than 10"),
    ("model.warm_start_lr=5", "model.warm_start_lr=5.0 must be in (0, 1)"),
    ("eval.temperature=-1", "eval.temperature=-1.0 must be in [0, 10]"),
    ("model.rope_theta=0", "model.rope_theta=0.0 must be > 0"),
])
def test_values_past_a_sane_range_are_refused(override, phrase):
    problems = plan_problems([override])
    assert len(problems) == 1 and phrase in problems[0], problems


KEY = re.compile(r"\b[a-z_]+(?:\.[a-z_]+)*(?==)")


@pytest.mark.parametrize("override", [
    "algo.entropy_top_frac=0", "algo.entropy_coef=-1", "algo.overlong_buffer=-1", "algo.overlong_penalty=-1",
    "algo.weight_decay=-1", "algo.grad_clip=-1", "algo.clip_low=1", "algo.clip_high=-1", "monitor.window=0",
    "monitor.max_nonfinite_steps=0", "monitor.kl_threshold=0", "monitor.delta_threshold=0", "eval.every=-1",
    "eval.samples=0", "eval.max_prompts=-1", "sync.bucket_mb=0", "sync.sleep_level=3", "model.warm_start_steps=-1",
    "model.warm_start_lr=0", "task.reward_workers=-1", "task.reward_timeout_s=0",
])
def test_a_refusal_names_only_the_value_that_is_wrong(override):
    key = override.split("=")[0]
    problems = plan_problems([override])
    assert len(problems) == 1, problems
    assert set(KEY.findall(problems[0])) == {key}, problems[0]


def test_all_zero_reward_weights_name_them_and_advise_an_override_the_command_line_takes():
    given = ["+task.rewards.exact_match=0", "+task.rewards.char_match=0"]
    (problem,) = plan_problems(given)
    assert problem.startswith("task.rewards.exact_match=0 and task.rewards.char_match=0: every weight is 0")
    fix = re.search(r"e\.g\. (\S+)\.$", problem).group(1)
    assert fix == "++task.rewards.exact_match=1.0"
    cfg = compose_run_config([*given, fix])  # beside the user's own overrides, as typed
    assert cfg.task.rewards == {"exact_match": 1.0, "char_match": 0.0}
    build_plan(cfg)


@pytest.mark.parametrize("given", [["++task.rewards.exact_match=-1"],
                                   ["+task.rewards.exact_match=0", "+task.rewards.char_match=-0.5"]])
def test_reward_weights_with_none_positive_are_refused_with_a_fix_the_command_line_takes(given):
    # each reward is in [0, 1]: with no positive weight the run would learn to fail them
    (problem,) = plan_problems(given)
    assert "no reward has a positive weight, so the total is highest (0) with every reward failed" in problem
    fix = re.search(r"e\.g\. (\S+) \(", problem).group(1)
    assert fix == "++task.rewards.exact_match=1.0"
    build_plan(compose_run_config([*given, fix]))  # a penalty beside a reward to earn is fine
