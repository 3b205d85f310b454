"""Agents written against the OpenAI SDK (task.env=agent) played inside an engine's episodes against stand-in
engines: the first call's messages become the prompt, later calls' new messages the environment's tokens, the
tokens trained on are the engine's own; tool calls come back as OpenAI tool_calls; an agent that rewrites its
conversation or raises scores 0."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest

from rlgen.engines.episodes import Episodes, EpisodeSpec
from rlgen.generated import GenResult
from rlgen.models.build import build_tokenizer
from rlgen.tasks.base import Prompt
from rlgen.types import Completion, GenRequest, SamplingParams

pytest.importorskip("openai")
AGENTS = Path(__file__).resolve().parents[1] / "envs"
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}<eos>{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")


@pytest.fixture(autouse=True)
def agents_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(AGENTS))


def ascii_tokenizer():
    """One token per printable ASCII character (braces and newlines too, for JSON tool calls), a chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", *string.printable])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<pad>", "<eos>")])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = TEMPLATE
    return tok


class Scripted:
    """Answers each call with the next of `answers` (then its end token), logprob -0.25 a token."""

    def __init__(self, tok, answers):
        self.tok, self.answers, self.seen = tok, list(answers), []

    def generate(self, requests):
        out = []
        for r in requests:
            self.seen.append(list(r.prompt_ids))
            ids = self.tok.encode(self.answers.pop(0), add_special_tokens=False) + [self.tok.eos_token_id]
            out.append(Completion(r.group_id, list(r.prompt_ids), ids, [-0.25] * len(ids), "stop", 1))
        return GenResult(completions=out, version=1)


PROMPT = Prompt("3+4=", "7")


def play(tok, fn, answers, chat, in_turns=True):
    spec = EpisodeSpec(env="agent", env_args={"fn": fn}, prompt=PROMPT, chat=chat, max_turns=4, env_timeout_s=10)
    req = GenRequest((0,), SamplingParams(n=1, max_new_tokens=64, stop_token_ids=(tok.eos_token_id,), seed=3), 0,
                     episode=spec)
    engine = Scripted(tok, answers)
    [c], _ = Episodes(engine.generate, [req], tok, in_turns=in_turns).run()
    return c, engine


@pytest.mark.parametrize("in_turns", [True, False])
def test_an_sdk_agent_plays_an_episode_on_the_engines_own_tokens(in_turns):
    tok = build_tokenizer()  # raw: no chat template; messages are their contents, one after another
    c, engine = play(tok, "sdk_agents:chain_agent", ["7", "10"], chat=False, in_turns=in_turns)
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    eos = tok.eos_token_id
    assert c.own_prompt and c.prompt_ids == enc("3+4=") and engine.seen[0] == enc("3+4=")
    assert c.token_ids == enc("7") + [eos] + enc("+4=") + enc("10") + [eos]
    assert c.loss_mask == [1, 1, 0, 0, 0, 1, 1, 1]
    assert engine.seen[1] == c.prompt_ids + c.token_ids[:5]  # the second turn continues the first, token for token
    assert c.env_reward == 0.5 and c.turns == 2 and c.env_error == ""


def test_an_async_sdk_agent_gets_tool_calls_and_sends_their_results_as_tool_messages():
    tok = ascii_tokenizer()
    call = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    c, engine = play(tok, "sdk_agents:tool_agent", [call, "So it is 7"], chat=True)
    assert c.env_error == "" and c.env_reward == 1.0 and c.turns == 2
    assert tok.decode(c.prompt_ids) == "s:Use the add tool.<eos>u:3+4=<eos>a:"
    text = tok.decode(c.token_ids)
    assert text == call + "<eos>" + "t:7<eos>a:" + "So it is 7<eos>"  # the tool's result: the template's tool turn
    policy = [t for t, m in zip(c.token_ids, c.loss_mask) if m]
    assert tok.decode(policy) == call + "<eos>" + "So it is 7<eos>"


@pytest.mark.parametrize("fn, said", [("sdk_agents:rewriting_agent", "does not extend its conversation"),
                                      ("sdk_agents:broken_agent", "the agent raised KeyError")])
def test_an_agent_that_rewrites_its_conversation_or_raises_scores_0(fn, said):
    c, _ = play(build_tokenizer(), fn, ["1", "2"], chat=False)
    assert said in c.env_error and c.env_reward == 0.0


def test_the_reply_carries_tool_calls_in_openais_shape():
    from rlgen.tasks.envs.agent import reply_of

    out = reply_of('Let me add. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "m", 2)
    message = out["choices"][0]["message"]
    assert message["content"] == "Let me add." and out["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"] == [{"id": "call_2_0", "type": "function",
                                      "function": {"name": "add", "arguments": json.dumps({"a": 1})}}]
    assert reply_of("7", "m", 1)["choices"][0]["message"] == {"role": "assistant", "content": "7"}
