"""Tool-using environments (rlgen.tasks.envs.tools): tool calls in the Qwen/Hermes format are parsed, run and
answered; a call that is not valid JSON, names no tool or raises gets the error back as its result; a turn without
a call is the final answer and is scored; the calculator computes arithmetic and nothing else."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rlgen.tasks.base import Prompt
from rlgen.tasks.envs import make_env
from rlgen.tasks.envs.tools import calculate, parse_tool_calls


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_tool_calls_are_parsed_and_bad_ones_say_why():
    calls = parse_tool_calls("let me compute " + call("calculate", expression="2*3") + " and "
                             + '<tool_call>{"name": "calculate", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>')
    assert [(c.name, c.arguments, c.error) for c in calls] == [("calculate", {"expression": "2*3"}, ""),
                                                               ("calculate", {"expression": "1+1"}, "")]
    assert "not valid JSON" in parse_tool_calls("<tool_call>{name: calculate}</tool_call>")[0].error
    assert "must be a JSON object" in parse_tool_calls('<tool_call>["calculate"]</tool_call>')[0].error
    assert "arguments must be" in parse_tool_calls('<tool_call>{"name": "x", "arguments": 3}</tool_call>')[0].error
    assert parse_tool_calls("the answer is 7") == []


def test_the_calculator_computes_arithmetic_and_refuses_anything_else():
    assert calculate("2 * (3 + 4) - 10 / 4") == "11.5"
    assert calculate("7 // 2 + 2 ** 10 % 7") == "5"
    assert calculate("-3 * -3") == "9"
    for bad in ("__import__('os').system('true')", "x + 1", "(1).real", "2 ** 1000", "10 ** 60 * 10 ** 60"):
        with pytest.raises(ValueError):
            calculate(bad)


def test_a_calculator_episode_calls_the_tool_then_is_scored_on_its_final_answer():
    env = make_env("calculator", {"max_calls": 2})
    [prompt] = env.draw(random.Random(3), 1)
    assert "calculate tool" in prompt.text and prompt.answer == calculate(prompt.text.split("What is ")[1].split("?")[0])
    env.reset(prompt, 0)
    step = env.step("I will use the tool. " + call("calculate", expression=prompt.text[8:].split("?")[0]))
    assert step.role == "tool" and step.observation == prompt.answer and not step.done and step.reward == 0
    bad = env.step("<tool_call>{oops</tool_call>" + call("search", q="x"))
    assert bad.observation.splitlines()[0].startswith("error: the tool call is not valid JSON")
    assert "error: no more tool calls (at most 2)" in bad.observation  # the third call of the episode
    final = env.step(f"The answer is {prompt.answer}.")
    assert final.done and final.reward == 1.0
    env.reset(prompt, 0)
    assert env.step("no idea").reward == 0.0


def test_unknown_tools_and_raising_tools_answer_with_the_error():
    env = make_env("calculator", {})
    env.reset(Prompt("What is 1/0?", "0"), 0)
    out = env.step(call("search", q="x") + call("calculate", expression="1/0") + call("calculate", wrong=1))
    lines = out.observation.splitlines()
    assert lines[0] == "error: no tool named 'search'; the tools are calculate"
    assert lines[1] == "error: ZeroDivisionError: division by zero"
    assert lines[2].startswith("error: TypeError: calculate() got an unexpected keyword argument 'wrong'")
    assert env.schemas()[0]["function"]["name"] == "calculate"


def test_the_last_number_reward_reads_the_final_number():
    from rlgen.tasks.rewards import last_number

    assert last_number("so 12 * 3 = 36, and the answer is 1,234.", "1234") == 1.0
    assert last_number("it is -7", "-7") == 1.0 and last_number("2.50", "2.5") == 1.0
    assert last_number("36 then 35", "36") == 0.0 and last_number("no number", "1") == 0.0


@pytest.mark.parametrize("code, said", [
    ("import socket\nsocket.socket().connect(('192.0.2.1', 80))", "the sandbox refuses socket.__new__"),
    ("import subprocess\nsubprocess.run(['true'])", "the sandbox refuses subprocess.Popen"),
    ("import os\nos.system('true')", "the sandbox refuses os.system"),
    ("import ctypes\nctypes.CDLL(None)", "the sandbox refuses ctypes.dlopen"),
    ("open('/tmp/rlgen-sandbox-escape', 'w')", "writes only in its own folder"),
    ("import os\nos.open('/tmp/rlgen-sandbox-escape', os.O_WRONLY | os.O_CREAT)", "writes only in its own folder"),
    ("x = bytearray(4 * 1024**3)", "MemoryError"),
    ("while True:\n    pass", "ran longer than 1 s and was stopped"),
])
def test_the_python_sandbox_refuses_the_network_processes_and_writes_outside_and_bounds_time_and_memory(code, said):
    from rlgen.tasks.envs.sandbox import run_python

    assert said in run_python(code, timeout_s=1, memory_mb=256)
    assert not Path("/tmp/rlgen-sandbox-escape").exists()


def test_a_python_episode_runs_the_program_in_its_own_folder_and_scores_the_answer():
    from rlgen.tasks.envs.sandbox import run_python

    assert run_python("open('x.txt', 'w').write('hi')\nimport os\nprint(open('x.txt').read(), os.getcwd() != '/')") \
        == "hi True"
    env = make_env("python", {"timeout_s": 2})
    [prompt] = env.draw(random.Random(1), 1)
    k, top = int(prompt.text.split("i**")[1].split()[0]), int(prompt.text.split("to ")[1].split("?")[0])
    env.reset(prompt, 0)
    step = env.step(call("run_python", code=f"print(sum(i**{k} for i in range(1, {top} + 1)))"))
    assert step.role == "tool" and step.observation == prompt.answer
    assert env.step(f"It is {step.observation}.").reward == 1.0
    assert env.schemas()[0]["function"]["name"] == "run_python"
