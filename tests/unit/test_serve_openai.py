"""`rlgen serve` driven by the official `openai` package (sync and async) over in-process hf engines: models (listed
and retrieved), text and chat completions with n, seed, stop and logprobs, usage that counts only the returned tokens,
errors the SDK reads as the server's sentence, and an out-of-vocabulary token id or a zero count refused with 400."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi.testclient import TestClient

from helpers import tiny_pool
from rlgen.serve.app import make_app

openai = pytest.importorskip("openai")

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def app():
    return make_app(tiny_pool(chat=True), token=TOKEN, max_sequences=64, max_body_mb=1.0)


@pytest.fixture()
def client(app):
    return openai.OpenAI(base_url="http://testserver/v1", api_key=TOKEN, max_retries=0,
                         http_client=TestClient(app, base_url="http://testserver"))


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"] and models.data[0].owned_by == "rlgen"


def test_a_model_is_retrieved_by_its_id(client, app):
    model = client.models.retrieve("tiny")
    assert model.id == "tiny" and model.object == "model" and model.owned_by == "rlgen"
    folder = app.state.serve.pool.model.path  # as requests may name it: slashes and all (the SDK sends %2F)
    assert "/" in folder and client.models.retrieve(folder).id == "tiny"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4")
    assert err.value.body["message"].startswith("model 'gpt-4' is not served here; this server serves 'tiny'")
    assert err.value.body["type"] == "not_found_error"


@pytest.mark.parametrize(("chat", "field", "value"), [
    (False, "max_tokens", 0), (False, "n", 0), (True, "max_tokens", 0), (True, "max_completion_tokens", 0),
    (True, "n", 0)])
def test_zero_tokens_or_choices_are_refused_naming_the_field(client, chat, field, value):
    """As OpenAI's API does: 0 is a value the request set, not a missing one to fill with the default."""
    with pytest.raises(openai.BadRequestError, match=f"{field}={value} must be at least 1"):
        if chat:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "2+2?"}],
                                           **{field: value})
        else:
            client.completions.create(model="tiny", prompt="3+4=", **{field: value})


def test_completions_with_n_seed_and_logprobs(client):
    out = client.completions.create(model="tiny", prompt="3+4=", max_tokens=6, n=2, temperature=1.0, seed=3,
                                    logprobs=1)
    assert len(out.choices) == 2 and out.object == "text_completion"
    assert all(len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) for c in out.choices)
    assert out.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in out.choices)
    assert all(c.model_extra["policy_version"] == 0 for c in out.choices)
    again = client.completions.create(model="tiny", prompt="3+4=", max_tokens=6, n=2, temperature=1.0, seed=3)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]  # seeded


def test_a_stop_string_cuts_text_tokens_logprobs_and_usage(client):
    def ask(seed, **kw):
        return client.completions.create(model="tiny", prompt="1+2=", max_tokens=24, seed=seed, temperature=3.0, logprobs=1, **kw)

    # a seeded sample long enough to hold a character to stop at, after its first two
    whole, seed = next((out, s) for s in range(50) if len((out := ask(s)).choices[0].text.strip()) >= 6)
    text, tokens = whole.choices[0].text, whole.choices[0].logprobs.tokens
    assert whole.usage.completion_tokens == len(tokens)
    stop = next(ch for ch in text[2:] if ch.strip())
    cut = ask(seed, stop=[stop])
    choice = cut.choices[0]
    assert choice.text == text[: text.index(stop)] and choice.finish_reason == "stop"
    kept = len(choice.logprobs.tokens)
    assert cut.usage.completion_tokens == kept < len(tokens) and stop in "".join(choice.logprobs.tokens)
    assert choice.logprobs.token_logprobs == whole.choices[0].logprobs.token_logprobs[:kept]


def test_chat_completions_use_the_chat_template(client):
    out = client.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "be brief"},
                                                                 {"role": "user", "content": "2+2?"}],
                                         max_tokens=5, temperature=0.0, logprobs=True, n=1)
    choice = out.choices[0]
    assert out.object == "chat.completion" and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.model_extra["policy_version"] == 0
    assert len(choice.logprobs.content) == out.usage.completion_tokens <= 5
    assert out.usage.prompt_tokens > len("be brief2+2?")  # the template's markers around the messages
    tops = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "2+2?"}], max_tokens=5,
                                          temperature=0.0, logprobs=True, top_logprobs=3).choices[0].logprobs.content
    for entry in tops:  # greedy: the sampled token is the most likely one
        assert 1 <= len(entry.top_logprobs) <= 3
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs=true"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], top_logprobs=2)


def test_the_sampling_fields_of_vllms_server_reach_the_engines(client):
    eos = client.completions.create(model="tiny", prompt="1+2=", max_tokens=8, temperature=0.0, logprobs=1)
    assert eos.choices[0].finish_reason == "stop"  # this model ends its answers quickly
    prompt = [5, 6, 7, 8]
    ban = {"logit_bias": {str(i): -100 for i in range(3)}}  # the special tokens, end of sequence among them

    def text(**kw):
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, extra_body={**ban, **kw.pop(
            "extra", {})}, logprobs=1, **kw)
        return out.choices[0]

    greedy = text(temperature=0.0)
    assert greedy.finish_reason == "length" and len(greedy.logprobs.tokens) == 16  # logit_bias banned the end
    assert text(temperature=1.0, seed=1, extra={"top_k": 1}).logprobs.tokens == greedy.logprobs.tokens
    assert text(temperature=1.0, seed=2, extra={"min_p": 1.0}).logprobs.tokens == greedy.logprobs.tokens
    plain = len(set(greedy.logprobs.tokens))
    assert len(set(text(temperature=0.0, frequency_penalty=2.0).logprobs.tokens)) > plain
    assert len(set(text(temperature=0.0, extra={"repetition_penalty": 3.0}).logprobs.tokens)) > plain
    top = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=1.0, seed=0, logprobs=3)
    assert all(1 <= len(pos) <= 4 for pos in top.choices[0].logprobs.top_logprobs)  # 3, and the sampled token
    with pytest.raises(openai.BadRequestError, match="logit_bias names token id 9999"):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=2, logit_bias={"9999": 5})


def test_errors_read_as_the_servers_sentence(client, app):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt=[[5, 6, 9999]], max_tokens=2)
    assert err.value.status_code == 400
    assert err.value.body["message"].startswith("prompt 0: token id 9999 is outside the model's vocabulary of ")
    with pytest.raises(openai.NotFoundError, match="model='gpt-4' is not served here"):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    with pytest.raises(openai.AuthenticationError, match="missing or wrong bearer token"):
        openai.OpenAI(base_url="http://testserver/v1", api_key="wrong", max_retries=0,
                      http_client=TestClient(app, base_url="http://testserver")).models.list()
    raw = TestClient(app, base_url="http://testserver").get("/v1/nope", headers={"Authorization": f"Bearer {TOKEN}"})
    assert raw.status_code == 404 and raw.json()["error"]["type"] == "not_found_error"
    assert "/v1/nope is not a route of rlgen serve" in raw.json()["error"]["message"]


def test_the_async_client_works_too(app):
    async def run() -> list[str]:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")
        client = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key=TOKEN, max_retries=0, http_client=http)
        outs = await asyncio.gather(*(client.completions.create(model="tiny", prompt="5+1=", max_tokens=4, seed=i)
                                      for i in range(4)))
        await http.aclose()
        return [o.choices[0].text for o in outs]

    texts = asyncio.run(run())
    assert len(texts) == 4 and all(isinstance(t, str) for t in texts)


def test_streamed_completions_match_the_unstreamed_ones(client):
    prompt, ban = [5, 6, 7, 8], {"logit_bias": {"1": -100}}  # no end of sequence: 12 tokens each
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, n=2, seed=5, logprobs=2,
                                      extra_body=ban)
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=12, n=2, seed=5, logprobs=2,
                                            extra_body=ban, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 24 and not chunks[-1].choices
    for k in range(2):
        parts = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == k]
        assert len(parts) > 2  # the text came in pieces
        assert "".join(p.text for p in parts) == whole.choices[k].text
        assert sum((p.logprobs.token_logprobs for p in parts if p.logprobs), []) == whole.choices[k].logprobs.token_logprobs
        assert [p.finish_reason for p in parts][-1] == "length" and parts[-1].model_extra["policy_version"] == 0


def test_streamed_chat_and_a_stop_string(client):
    messages = [{"role": "user", "content": "2+2?"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0.0)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0.0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason

    def text(seed, **kw):
        return client.completions.create(model="tiny", prompt="1+2=", max_tokens=24, seed=seed, temperature=3.0, **kw)

    # a seeded sample long enough to hold a character to stop at, after its first two
    full, seed = next((t, s) for s in range(50) if len((t := text(s).choices[0].text).strip()) >= 6)
    stop = next(ch for ch in full[2:] if ch.strip())
    parts = [c.choices[0] for c in text(seed, stop=[stop], stream=True)]
    assert "".join(p.text for p in parts) == full[: full.index(stop)] and parts[-1].finish_reason == "stop"


def test_echo_puts_the_prompt_before_the_completion(client):
    plain = client.completions.create(model="tiny", prompt="3+4=", max_tokens=5, temperature=0.0)
    echoed = client.completions.create(model="tiny", prompt="3+4=", max_tokens=5, temperature=0.0, echo=True)
    assert echoed.choices[0].text == "3+4=" + plain.choices[0].text
    assert echoed.usage.completion_tokens == plain.usage.completion_tokens  # the prompt is not counted twice
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="3+4=", max_tokens=5, temperature=0.0, echo=True, stream=True) if c.choices)
    assert streamed == echoed.choices[0].text
    with pytest.raises(openai.BadRequestError, match="echo with logprobs"):
        client.completions.create(model="tiny", prompt="3+4=", max_tokens=5, echo=True, logprobs=1)


def test_every_choice_and_chunk_carries_the_policy_version():
    """After a weight update to version 3, every answer says 3: whole choices and every streamed chunk, text and
    chat alike (the role chunk and an echo chunk included)."""
    pool = tiny_pool(1, chat=True)
    engine = pool.engines[0]
    weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
    assert asyncio.run(pool.update_weights(weights, 3, None))["version"] == 3
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", max_retries=0, http_client=TestClient(
        make_app(pool, token=None, max_sequences=64, max_body_mb=1.0), base_url="http://testserver"))
    ask = {"model": "tiny", "max_tokens": 4, "temperature": 0.0}
    whole = sdk.completions.create(prompt="3+4=", **ask)
    chat = sdk.chat.completions.create(messages=[{"role": "user", "content": "2+2?"}], **ask)
    assert whole.choices[0].model_extra["policy_version"] == chat.choices[0].model_extra["policy_version"] == 3
    text_chunks = list(sdk.completions.create(prompt="3+4=", stream=True, echo=True, **ask))
    chat_chunks = list(sdk.chat.completions.create(messages=[{"role": "user", "content": "2+2?"}], stream=True, **ask))
    versions = [c.model_extra["policy_version"] for chunk in text_chunks + chat_chunks for c in chunk.choices]
    assert len(versions) >= 4 and set(versions) == {3}
