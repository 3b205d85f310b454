"""Agents written against the OpenAI SDK, as a user would write them, for the agent tests (task.env=agent)."""

from __future__ import annotations

import json


def chain_agent(client, prompt):
    """Chained addition over the chat API: the answer to the prompt, then to "+4=" after it; 0.5 each."""
    messages = [{"role": "user", "content": prompt.text}]
    total, score = int(prompt.answer), 0.0
    for _ in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages)
        text = reply.choices[0].message.content
        score += 0.5 if text.strip() == str(total) else 0.0
        total += 4
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "+4="}]
    return score


async def tool_agent(client, prompt):
    """Asks, runs the tool calls the reply makes (an adder), sends their results, and scores the last answer."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [{"role": "system", "content": "Use the add tool."}, {"role": "user", "content": prompt.text}]
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
        message = reply.choices[0].message
        if not message.tool_calls:
            return 1.0 if message.content.strip().endswith(prompt.answer) else 0.0
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    return 0.0


def rewriting_agent(client, prompt):
    """Calls twice with a second conversation that does not extend the first."""
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": prompt.text}])
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "again"}])
    return 1.0


def broken_agent(client, prompt):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": prompt.text}])
    raise KeyError("the agent's own bug")
