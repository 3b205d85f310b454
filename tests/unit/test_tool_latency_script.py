"""benchmarks/tool_latency.py: its sides ask for the same policy tokens per episode, its engine time counts the
waits on tools as the engines' (generate plus env spans) with overlapping batches' seconds counted once, and its slow tool sleeps as told and scores the product."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


script = load("tool_latency_script", ROOT / "tool_latency.py")
slow_tool = load("slow_tool_env", ROOT / "envs" / "slow_tool.py")


def test_the_sides_ask_for_the_same_policy_tokens_and_room_for_the_tools_answers():
    single = script.side_overrides("single", 512, 4)
    tool = script.side_overrides("tool", 512, 4)
    turns = script.side_overrides("turns", 512, 4)
    assert "algo.max_new_tokens=512" in single and "task=arith" in single
    assert "algo.max_new_tokens=128" in tool and "task.max_turns=4" in tool
    assert "task.max_total_tokens=800" in tool  # 4 x 128 of the policy's, 3 answers of up to 96
    assert [o for o in turns if "ms=" in o] == ["++task.env_args.min_ms=0", "++task.env_args.max_ms=0"]
    assert not [o for o in tool if "ms=" in o]  # the tool side keeps the environment's 50-500 ms


def test_engine_time_is_generation_plus_waiting_on_tools_of_the_busiest_engine():
    record = {"timeline": [
        {"actor": "engine0", "phase": "generate", "start": 0.0, "end": 3.0},
        {"actor": "engine0", "phase": "env", "start": 3.0, "end": 3.5},
        {"actor": "engine1", "phase": "generate", "start": 0.0, "end": 2.0},
        {"actor": "learner0", "phase": "train", "start": 0.0, "end": 9.0},
    ]}
    assert script.engine_seconds(record) == [3.0, 0.5]
    assert script.engine_seconds({"timeline": []}) == [0.0, 0.0]


def _record(step: int, start: float, tokens: int, step_s: float) -> dict:
    """A step whose batch kept engine0 busy 4 s from ``start`` (the last 0.5 s all its episodes on tools)."""
    return {"step": step, "response_tokens": tokens, "step_s": step_s, "timeline": [
        {"actor": "engine0", "phase": "generate", "start": start, "end": start + 3.5},
        {"actor": "engine0", "phase": "env", "start": start + 3.5, "end": start + 4.0},
        {"actor": "learner0", "phase": "train", "start": start + 4.0, "end": start + 6.0}]}


def test_overlapping_batches_count_each_engine_second_once_and_the_run_leaves_out_the_steps_with_none_behind(
        tmp_path):
    assert script.union_s([(0.0, 4.0), (3.0, 5.0), (7.0, 8.0)]) == 6.0
    assert script.union_s([]) == 0.0
    # steps 2-5 used; each batch starts 3 s after the one before and overlaps it for 1 s
    records = [_record(k, 3.0 * k, 1000, 3.0 if k < 5 else 1.0) for k in range(6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "plan.json").write_text(json.dumps({"async_steps": 1}))
    got = script.summarize(tmp_path)
    assert got["steps_used"] == [2, 3, 4, 5] and got["run_steps"] == [2, 3, 4]
    assert got["engine_busy_s"] == 13.0  # 6 .. 19: four 4-s batches, three 1-s overlaps
    assert got["engine_tokens_per_s"] == 4000 / 13.0
    assert got["engine_idle_on_env"] == 2.0 / 13.0
    assert got["median"]["tokens_per_s"] == 1000 / 4.0  # one batch over its own span
    assert got["run_tokens_per_s"] == 3000 / 9.0
    (tmp_path / "plan.json").unlink()  # an older run folder: the command's override says how far ahead
    assert script.summarize(tmp_path, ["algo.async_steps=2"])["run_steps"] == [2, 3]


def test_the_slow_tool_sleeps_within_its_bounds_and_scores_the_last_turn():
    env = slow_tool.SlowToolEnv(turns=3, min_ms=20, max_ms=40)
    prompt = env.draw(random.Random(0), 1)[0]
    env.reset(prompt, seed=7)
    t0 = time.time()
    first = asyncio.run(env.step("thinking"))
    assert 0.02 <= time.time() - t0 < 0.5 and first.role == "tool" and not first.done
    assert len(first.observation) == 24
    asyncio.run(env.step("more"))
    last = asyncio.run(env.step(f"so it is {prompt.answer}"))
    assert last.done and last.reward == 1.0 and 0.04 <= env.waited_s <= 0.08


def test_every_side_runs_as_far_ahead_as_the_tool_side_plans():
    gpu = ["engine=vllm", "model=qwen2_5_0_5b", "hardware=1xh100"]
    assert script.same_async_steps(gpu, 512, 4) == [*gpu, "algo.async_steps=2"]  # multi-turn on a GPU
    cpu = ["model.max_position_embeddings=256"]
    assert script.same_async_steps(cpu, 16, 2) == [*cpu, "algo.async_steps=0"]  # the CPU default: on-policy
    assert script.same_async_steps([*gpu, "algo.async_steps=1"], 512, 4) == [*gpu, "algo.async_steps=1"]
