"""benchmarks/tool_latency.py: its sides ask for the same policy tokens per episode, its engine time counts the
waits on tools as the engines' (generate plus env spans), and its slow tool sleeps as told and scores the product."""

from __future__ import annotations

import asyncio
import importlib.util
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
