"""algo.launch_ahead as the plan fills it (rlgen.plan.launch_ahead): own_in where a flight beside the tail the
learner waits for would make its decode steps several times as long, step_start where the overlap is nearly
free, on-policy or without a decode-step model."""

from __future__ import annotations

import pytest

from rlgen.config import LaunchAhead
from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.plan.launch_ahead import SLOWDOWN_OWN_IN, tail_slowdown

GPU = ["engine=vllm", "hardware=1xh200", "model=qwen2_5_0_5b", "algo.max_new_tokens=2048",
       "task.response_length_mean=256", "engine.max_model_len=2112"]


def _plan(*overrides: str):
    return build_plan(compose_run_config([*GPU, *overrides]))


def _setting(plan) -> tuple[object, str]:
    s = next(s for s in plan.settings if s.key == "algo.launch_ahead")
    return s.value, s.source


def test_many_sequences_a_flight_wait_for_the_steps_own():
    plan = _plan("algo.prompts_per_step=64")  # 512 sequences a step
    assert tail_slowdown(plan) >= SLOWDOWN_OWN_IN
    assert plan.config.algo.launch_ahead is LaunchAhead.own_in
    value, why = _setting(plan)
    assert value is LaunchAhead.own_in and why.startswith("derived:") and "x as long" in why


def test_few_sequences_a_flight_go_out_at_the_steps_start():
    plan = _plan("algo.prompts_per_step=8")  # 64 sequences a step
    assert 1.0 < tail_slowdown(plan) < SLOWDOWN_OWN_IN
    assert plan.config.algo.launch_ahead is LaunchAhead.step_start


def test_the_slowdown_grows_with_the_sequences_a_flight():
    slow = [tail_slowdown(_plan(f"algo.prompts_per_step={n}")) for n in (4, 16, 64)]
    assert slow == sorted(slow) and slow[0] < slow[-1]


@pytest.mark.parametrize("value", ["step_start", "own_in"])
def test_the_configs_value_is_kept(value):
    plan = _plan("algo.prompts_per_step=64", f"algo.launch_ahead={value}")
    assert plan.config.algo.launch_ahead == LaunchAhead(value) and _setting(plan) == (LaunchAhead(value), "config")


def test_on_policy_and_cpu_runs_go_out_at_the_steps_start():
    on_policy = _plan("algo.prompts_per_step=64", "algo.async_steps=0")
    assert on_policy.config.algo.launch_ahead is LaunchAhead.step_start and "on-policy" in _setting(on_policy)[1]
    cpu = build_plan(compose_run_config([]))
    assert cpu.config.algo.launch_ahead is LaunchAhead.step_start
    assert tail_slowdown(cpu) is None  # no decode-step model on CPU


def test_an_unknown_value_is_refused_in_a_sentence():
    from rlgen.config.compose import ConfigError

    with pytest.raises(ConfigError) as err:
        compose_run_config(["algo.launch_ahead=soon"])
    assert "launch_ahead" in str(err.value)
