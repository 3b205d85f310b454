"""Multi-turn episodes on a local Ray cluster on CPU: the chained-addition game (task=chain) learns, its batches
hold the environment's tokens out of the loss, and an environment of one's own (module:Class) that raises, hangs or
answers with something else ends only those episodes, each scored 0 and counted, while the run goes on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_durable_runs import StopAtStep

from helpers import MIN_REWARD_GAIN, assert_learned, assert_same_steps, train_or_stopped
from rlgen.config.compose import compose_run_config
from rlgen.engines.registry import EngineSpec, register_engine, unregister_engine
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import PlanError, build_plan
from rlgen.runtime.run import run_training

ENVS = Path(__file__).resolve().parents[1] / "envs"


@pytest.mark.slow
@pytest.mark.long  # 120 steps; the multi-turn machinery is in make test through the other episode tests
def test_the_chain_game_learns(tmp_path, no_kept):
    cfg = compose_run_config(["progress=false", "task=chain", "steps=120"])
    summary = run_training(build_plan(cfg), tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(records) == 120
    assert_learned(records, summary, MIN_REWARD_GAIN)
    # every episode: two turns of the policy's, and "+c=" (3 tokens) of the environment's between, out of the loss
    assert all(r["env/turns"] == 2.0 and r["env/tokens"] == 3.0 and r["env/errors"] == 0 for r in records)
    assert max(r["mismatch/max_abs_delta"] for r in records) < 1e-3  # the learner scores the engine's own tokens


def test_a_reasoning_gym_dataset_trains_by_name(tmp_path, no_kept):
    pytest.importorskip("reasoning_gym")
    cfg = compose_run_config(["progress=false", "task=reasoning_gym", "task.env_args.dataset=basic_arithmetic",
                              "++task.env_args.config={max_terms: 2, max_digits: 1}", "steps=3"])
    run_training(build_plan(cfg), tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(records) == 3 and all(r["env/turns"] == 1.0 and r["env/errors"] == 0 for r in records)
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in records)


def test_a_verifiers_environment_trains_unchanged(tmp_path, no_kept, monkeypatch):
    pytest.importorskip("verifiers")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(ENVS))
    # a loaded 2-core machine takes more than the default 30 s for some first environment steps (each episode's
    # thread starts verifiers' rollout there); what is checked here is the adapter, not that bound
    cfg = compose_run_config(["progress=false", "task=verifiers", "task.env_args.env=vf_chain", "task.max_turns=2",
                              "task.max_total_tokens=16", "task.max_prompt_tokens=8", "steps=3",
                              "task.env_timeout_s=300"])
    run_training(build_plan(cfg), tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    # every episode: its MultiTurnEnv's two turns, "+c=" (3 tokens) of the environment's between, scored by its rubric
    assert len(records) == 3 and all(r["env/turns"] == 2.0 and r["env/tokens"] == 3.0 and r["env/errors"] == 0
                                     for r in records)
    assert all(0.0 < r["reward_mean"] < 1.0 for r in records)


def _run(out: Path, overrides: list[str], stop=None, resume: bool = False):
    return train_or_stopped(["progress=false", "task=chain", *overrides], out, stop=stop, resume=resume)


# make test-all only; in make test: resume equality: test_durable_runs; episodes: the other tests here
@pytest.mark.long
def test_episodes_generated_ahead_are_kept_by_a_checkpoint_and_a_resumed_run_equals_the_whole(tmp_path, no_kept):
    overrides = ["steps=6", "algo.async_steps=1", "algo.prompts_per_step=8", "checkpoint.every=0"]
    assert _run(tmp_path / "whole", overrides) is None
    reference = read_jsonl(tmp_path / "whole" / "metrics.jsonl")
    out = tmp_path / "stopped"
    err = _run(out, overrides, stop=StopAtStep(3, out))
    assert err is not None and err.step == 3
    assert _run(out, overrides, resume=True) is None
    assert_same_steps(read_jsonl(out / "metrics.jsonl"), reference)
    assert [r["env/turns"] for r in reference] == [2.0] * 6


# make test-all only; in make test: episodes: the other tests here
@pytest.mark.long
def test_a_failing_environment_scores_its_episodes_0_and_the_run_goes_on(tmp_path, no_kept, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(ENVS))
    cfg = compose_run_config(["progress=false", "task=env", "task.env=flaky_env:FlakyEnv", "task.max_prompt_tokens=8", "task.max_total_tokens=16",
                              "task.env_timeout_s=1", "++task.env_args.hang_s=3", "steps=3"])
    summary = run_training(build_plan(cfg), tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(records) == 3 and summary["steps"] == 3
    assert all(r["env/errors"] > 0 for r in records)
    log = (tmp_path / "run.log").read_text()
    for why in ("the calculator is down", "longer than task.env_timeout_s=1", "returned dict, not"):
        assert why in log
    assert log.count("episodes ended with an error and scored 0") == 1  # named once; env/errors counts each step
    # the hanging calls made the steps long: said once, with what they cost, not as a stuck actor
    assert log.count("environment calls ran past task.env_timeout_s=1 s and were killed") == 1


@pytest.fixture
def single_turn_engine():
    register_engine(EngineSpec(kind="single_turn", actor="rlgen.engines.hf.engine:HFEngine"))  # claims no episodes
    yield
    unregister_engine("single_turn")


@pytest.mark.parametrize("overrides, said", [
    (["task.env=nowhere_at_all:Env"], "cannot be imported"),
    (["task.env=no_such_env"], "is not an environment"),
    (["engine.kind=single_turn"], "plays multi-turn episodes inside the engines, which engine=single_turn"),
    (["task.max_turns=0"], "task.max_turns=0 must be at least 1"),
    (["task.env_args.links=0"], "refuses task.env_args={'links': 0, 'max_operand': 10}: links and max_operand"),
    (["task.stop=[x]"], "leave task.stop empty"),
])
def test_bad_environment_settings_are_one_sentence_before_anything_starts(single_turn_engine, overrides, said):
    with pytest.raises(PlanError) as err:
        build_plan(compose_run_config(["task=chain", *overrides]))
    assert said in str(err.value)


def test_an_agent_written_against_the_openai_sdk_trains_as_it_is(tmp_path, no_kept, monkeypatch):
    pytest.importorskip("openai")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(ENVS))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(10) for b in range(10)))
    cfg = compose_run_config(["progress=false", "task=env", "task.env=agent", "++task.env_args.fn=sdk_agents:chain_agent",
                              f"task.path={rows}", "task.max_prompt_tokens=8", "task.max_total_tokens=16",
                              "steps=4"])
    summary = run_training(build_plan(cfg), tmp_path / "run")
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(records) == 4 and summary["steps"] == 4
    # each episode: the agent's two calls, "+4=" between them as the environment's tokens, no errors
    assert all(r["env/turns"] == 2.0 and r["env/tokens"] == 3.0 and r["env/errors"] == 0 for r in records)
    assert max(r["mismatch/max_abs_delta"] for r in records) < 1e-3
    assert 0 < sum(r["reward_mean"] for r in records) / 4 < 1


def test_an_environment_of_ones_own_runs_on_the_default_model_with_the_bounds_fitted(tmp_path, no_kept, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(ENVS))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(10)))
    cfg = compose_run_config(["progress=false", "task=env", "task.env=episode_envs:EchoEnv", f"task.path={rows}",
                              "steps=2", "algo.prompts_per_step=4", "algo.samples_per_prompt=2"])
    plan = build_plan(cfg)  # no bound set: the plan fits them to the model's 128 positions
    assert (plan.config.task.max_prompt_tokens, plan.config.task.max_total_tokens) == (25, 103)
    summary = run_training(plan, tmp_path / "run")
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(records) == 2 and summary["steps"] == 2
    assert all(r["env/turns"] == 3.0 and r["env/errors"] == 0 for r in records)  # EchoEnv's three turns each


def test_a_step_made_long_by_environment_timeouts_is_said_so_not_stuck(tmp_path, no_kept, monkeypatch):
    from rlgen.runtime.errors import RunError

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(ENVS))
    cfg = compose_run_config(["progress=false", "task=env", "task.env=flaky_env:FlakyEnv", "task.max_prompt_tokens=8",
                              "task.max_total_tokens=16", "task.env_timeout_s=1", "++task.env_args.hang_s=3",
                              "steps=1", "timeout_s=3"])
    with pytest.raises(RunError) as err:
        run_training(build_plan(cfg), tmp_path)
    said = str(err.value)
    assert said.startswith("generation for step 0 did not finish within timeout_s=3 s: its episodes' environment "
                           "calls alone may take up to task.env_timeout_s=1 s a call x 5 calls an episode")
    assert "lower task.env_timeout_s, raise task.env_workers, or raise timeout_s above 160." in said
    assert "stuck" not in said
