"""Tool-using environments: the policy calls tools in the Qwen/Hermes format and ends with a final answer.

A turn that holds ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks gets each tool's result back
(role ``tool``: a chat template renders it as its tool turn; a raw prompt gets it inside ``<tool_response>``). A
call whose JSON does not parse, names no tool, or raises gets the error back as its result, as the model would in
deployment. A turn without a call is the final answer: ``task.env_args.reward`` (a registered reward or
module:function, ``last_number`` by default) scores it against the prompt's answer, and the episode ends.

``calculator`` (arithmetic, with its own prompts or GSM8K-style rows) and ``python`` (a sandboxed interpreter,
rlgen.tasks.envs.sandbox) are built in; a ToolEnv subclass with ``tools`` of its own is a new tool task.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlgen.tasks.base import Prompt
from rlgen.tasks.envs import Step, register_env

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
MAX_RESULT_CHARS = 2000


@dataclass
class ToolCall:
    name: str = ""
    arguments: dict[str, Any] | None = None
    error: str = ""  # why the call could not be read


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every <tool_call> block of a turn, parsed; a block that is not a JSON object with a name is an error."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            data = json.loads(body)
        except json.JSONDecodeError as err:
            calls.append(ToolCall(error=f"the tool call is not valid JSON ({err})"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall(error='a tool call must be a JSON object {"name": ..., "arguments": {...}}'))
            continue
        args = data.get("arguments", {})
        if isinstance(args, str):  # some models send the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not isinstance(args, dict):
            calls.append(ToolCall(data["name"], error="the tool call's arguments must be a JSON object"))
            continue
        calls.append(ToolCall(data["name"], args))
    return calls


class ToolEnv:
    """Tools by name (``tools``: name -> function of keyword arguments returning text) and a final answer."""

    tools: dict[str, Callable[..., Any]] = {}

    def __init__(self, reward: str = "last_number", max_calls: int = 4):
        from rlgen.tasks.rewards import resolve_reward

        self.reward_name, self.max_calls = reward, int(max_calls)
        self.score = resolve_reward(reward, "task.env_args.reward")
        self.prompt, self.calls = Prompt("", ""), 0

    def schemas(self) -> list[dict[str, Any]]:
        """The tools as the chat template's ``tools=`` describes them to the model (OpenAI function schemas)."""
        return [getattr(fn, "schema", {"type": "function", "function": {"name": name}}) for name, fn in
                self.tools.items()]

    def reset(self, prompt: Prompt, seed: int) -> None:
        self.prompt, self.calls = prompt, 0

    def step(self, action: str) -> Step:
        calls = parse_tool_calls(action)
        if not calls:
            return Step(None, float(self.score(action, self.prompt.answer)), True)
        results = []
        for call in calls:
            self.calls += 1
            results.append(self._run(call) if self.calls <= self.max_calls else
                           f"error: no more tool calls (at most {self.max_calls}); give the final answer")
        return Step("\n".join(results), 0.0, False, role="tool")

    def _run(self, call: ToolCall) -> str:
        if call.error:
            return f"error: {call.error}"
        fn = self.tools.get(call.name)
        if fn is None:
            return f"error: no tool named {call.name!r}; the tools are {', '.join(sorted(self.tools))}"
        try:
            return str(fn(**call.arguments))[:MAX_RESULT_CHARS]
        except Exception as err:  # noqa: BLE001 - the model reads what went wrong, as it would in deployment
            return f"error: {type(err).__name__}: {err}"


# -- the calculator ---------------------------------------------------------------------------------------
_OPS: dict[type, Callable[..., Any]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                                        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
                                        ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
                                        ast.UAdd: operator.pos}
MAX_POWER = 64  # exponents beyond this (and numbers over 1e100) are refused rather than computed


def calculate(expression: str) -> str:
    """The value of an arithmetic expression (+ - * / // % ** and parentheses over numbers), as text."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_POWER:
                raise ValueError(f"exponent {right} is too large")
            out = _OPS[type(node.op)](left, right)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            out = _OPS[type(node.op)](value(node.operand))
        else:
            raise ValueError("only numbers, + - * / // % ** and parentheses are allowed")
        if abs(out) > 1e100:
            raise ValueError("the result is too large")
        return out

    result = value(ast.parse(str(expression), mode="eval").body)
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)


def text_tool_schema(name: str, description: str, argument: str) -> dict[str, Any]:
    """The OpenAI function schema of a tool that takes one string argument."""
    return {"type": "function",
            "function": {"name": name, "description": description,
                         "parameters": {"type": "object", "properties": {argument: {"type": "string"}},
                                        "required": [argument]}}}


calculate.schema = text_tool_schema("calculate", "Evaluate an arithmetic expression.", "expression")  # type: ignore[attr-defined]


@register_env("calculator")
class CalculatorEnv(ToolEnv):
    """Arithmetic with a calculator tool: its own prompts (two to three operations over numbers up to
    ``max_operand``), or GSM8K-style rows from task.path."""

    tools = {"calculate": calculate}

    def __init__(self, reward: str = "last_number", max_calls: int = 4, max_operand: int = 1000):
        super().__init__(reward, max_calls)
        self.max_operand = int(max_operand)

    def draw(self, rng: Any, n: int) -> list[Prompt]:
        out = []
        for _ in range(n):
            a, b, c = (rng.randrange(2, self.max_operand) for _ in range(3))
            op1, op2 = rng.choice("+-*"), rng.choice("+-*")
            expression = f"{a} {op1} {b} {op2} {c}"
            out.append(Prompt(f"What is {expression}? Use the calculate tool, then give the number.",
                              calculate(expression)))
        return out
