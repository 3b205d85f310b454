"""`rlgen serve`'s HTTP API over in-process hf engines, through rlgen's own clients: generation spread over the
engines, versions, weight pushes that change the outputs, the token, oversized and malformed requests,
sleep/wake, pause/resume and the OpenAI-style completions."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from rlgen.config import EngineConfig
from rlgen.config.compose import compose_run_config
from rlgen.engines.hf.engine import HFEngine
from rlgen.generated import GenResult
from rlgen.models import load_tokenizer, prepare_model
from rlgen.plan import build_plan
from rlgen.serve.app import make_app
from rlgen.serve.pool import EnginePool, ServedModel
from rlgen.types import GenRequest, SamplingParams
from rlgen.wire.client import AsyncGenerationClient, GenerationClient, ServerError
from rlgen.wire.protocol import split_by_samples

TOKEN = "s3cret"
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def served():
    cfg = compose_run_config([])
    path = prepare_model(cfg)
    plan = build_plan(cfg)
    engines = [HFEngine(path, EngineConfig(dtype="float32"), seed=i, name=f"engine{i}") for i in range(2)]
    model = ServedModel("tiny", path, plan.model.params, plan.model.vocab_size, 64, "hf", 1, load_tokenizer(path))
    return engines, model


def _client(served, *, token: str | None = TOKEN, timeout_s: float = 60.0, **limits) -> GenerationClient:
    engines, model = served
    pool = EnginePool(engines, model, timeout_s=timeout_s, local=True)
    app = make_app(pool, token=TOKEN, max_sequences=limits.get("max_sequences", 64),
                   max_body_mb=limits.get("max_body_mb", 1.0))
    client = GenerationClient("http://testserver", token=token)
    client._http = TestClient(app, base_url="http://testserver", headers=client._http.headers)
    client.pool = pool
    return client


def test_generation_is_spread_over_engines_in_request_order(served):
    client = _client(served)
    out = client.generate_ids([PROMPT, [9, 10]], n=3, max_tokens=5, seed=1)
    assert [c.group_id for c in out.completions] == [0, 0, 0, 1, 1, 1]
    assert [c.prompt_ids for c in out.completions] == [PROMPT] * 3 + [[9, 10]] * 3
    assert all(1 <= len(c.token_ids) <= 5 and len(c.logprobs) == len(c.token_ids) for c in out.completions)
    assert {s["engine"] for s in out.spans} == {0, 1}  # two requests, two engines
    assert client.info()["sequences"] == 6
    reqs = [GenRequest(tuple(PROMPT), SamplingParams(n=3, max_new_tokens=5, seed=1), 0)]
    first, again = client.generate(reqs, engine=0), client.generate(reqs, engine=0)
    assert [c.token_ids for c in again.completions] == [c.token_ids for c in first.completions]  # seeded


def test_split_by_samples_balances_and_keeps_order():
    reqs = [GenRequest((1,), SamplingParams(n=n), i) for i, n in enumerate([2, 3, 1, 1, 1])]
    shards = split_by_samples(reqs, 2)
    assert [r.group_id for s in shards for r in s] == [0, 1, 2, 3, 4]
    assert [sum(r.sampling.n for r in s) for s in shards] == [5, 3]
    assert [r for s in split_by_samples(reqs[:1], 3) for r in s] == reqs[:1]  # one request goes whole to one engine


def test_weight_push_changes_outputs_and_versions(served):
    engines, _ = served
    client = _client(served)
    before = client.generate_ids([PROMPT], n=1, max_tokens=6, temperature=0.0, ignore_eos=True).completions[0]
    original = {k: v.clone() for k, v in engines[0].model.state_dict().items()}
    try:
        gen = torch.Generator().manual_seed(0)
        changed = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
        res = client.update_weights(changed, version=7)
        assert res["version"] == 7 and res["engines"] == [0, 1]
        after = client.generate_ids([PROMPT], n=1, max_tokens=6, temperature=0.0, ignore_eos=True).completions[0]
        assert after.version == 7 and before.version == 0
        assert after.logprobs != before.logprobs
        assert client.info()["versions"] == [7, 7]
        client.update_weights(original, version=8, engine=1)
        assert client.info()["versions"] == [7, 8]
        with pytest.raises(ServerError, match="weights do not match the model"):
            client.update_weights({"nope.weight": torch.zeros(2)}, version=9)
    finally:
        for e in engines:
            e.update_weights(original, 0)


def test_token_is_required_except_for_health(served):
    anonymous = _client(served, token=None)
    assert anonymous.health()["ok"]
    with pytest.raises(ServerError, match="bearer token") as err:
        anonymous.info()
    assert err.value.status == 401
    with pytest.raises(ServerError, match="bearer token"):
        _client(served, token="wrong").generate_ids([PROMPT])


def test_oversized_and_malformed_requests_are_refused_with_the_fix(served):
    client = _client(served, max_sequences=8, max_body_mb=0.01)
    cases = [
        (lambda: client.generate_ids([PROMPT] * 3, n=3), 413, "over serve.max_sequences=8; split it"),
        (lambda: client.generate_ids([PROMPT], max_tokens=100), 413, "over this server's max_model_len of 64"),
        (lambda: client.generate_ids([[1] * 6000]), 413, "over serve.max_body_mb"),
        (lambda: client.generate_ids([[5, 999]]), 400, "outside the model's vocabulary of"),
        (lambda: client.generate_ids([[]]), 400, "prompt_ids is empty"),
        (lambda: client.generate_ids([PROMPT], top_p=0.0), 400, "top_p=0.0 must be in"),
        (lambda: client.generate([], engine=None), 400, "non-empty list"),
        (lambda: client.generate_ids([PROMPT]) and client.generate(
            [GenRequest(tuple(PROMPT), SamplingParams(), 0)], engine=5), 404, "engines 0..1"),
    ]
    for call, status, text in cases:
        with pytest.raises(ServerError, match=text) as err:
            call()
        assert err.value.status == status, text
    raw = client._http.post("/generate", json={"requests": [{"prompt_ids": [1], "temp": 1}]})
    assert raw.status_code == 400 and "unknown field(s) ['temp']" in raw.json()["error"]["message"]
    big = b'{"requests": [{"prompt_ids": [' + b"1, " * 6000 + b'1]}]}'
    chunked = client._http.post("/generate", content=iter([big[:5000], big[5000:]]))  # no Content-Length
    assert chunked.status_code == 413 and "over serve.max_body_mb" in chunked.json()["error"]["message"]


def test_sleep_wake_pause_resume(served):
    client = _client(served, timeout_s=1.0)
    client.sleep(1)
    with pytest.raises(ServerError, match="asleep; POST /wake") as err:
        client.generate_ids([PROMPT])
    assert err.value.status == 409
    client.wake()
    assert client.generate_ids([PROMPT]).completions
    client.pause(engine=0)
    assert client.info()["paused"] == [True, False]
    with pytest.raises(ServerError, match="stayed paused"):
        client.generate([GenRequest(tuple(PROMPT), SamplingParams(), 0)], engine=0)
    assert client.generate([GenRequest(tuple(PROMPT), SamplingParams(), 0)], engine=1).completions
    client.resume()
    assert client.generate([GenRequest(tuple(PROMPT), SamplingParams(), 0)], engine=0).completions


def test_a_paused_engine_holds_requests_until_resumed(served):
    engines, model = served
    pool = EnginePool(engines, model, timeout_s=30.0, local=True)

    async def scenario() -> list:
        await pool.pause(None)
        job = asyncio.create_task(pool.generate([GenRequest(tuple(PROMPT), SamplingParams(max_new_tokens=2), 0)]))
        await asyncio.sleep(0.3)
        held = not job.done()
        await pool.resume(None)
        out = await asyncio.wait_for(job, 30)
        return [held, len(out["completions"])]

    assert asyncio.run(scenario()) == [True, 1]


class _Slow:
    """An engine that takes a second per call, one call at a time (as an hf engine actor does)."""

    def generate(self, requests, version=None):
        import time

        time.sleep(1.0)
        return GenResult(completions=[], version=0)

    def health(self):
        return {"ok": True}


def test_health_answers_at_once_for_a_busy_engine(served):
    _, model = served
    pool = EnginePool([_Slow()], model, timeout_s=30.0, local=True)

    async def scenario() -> list:
        job = asyncio.create_task(pool.generate([GenRequest(tuple(PROMPT), SamplingParams(), 0)]))
        await asyncio.sleep(0.2)
        t0 = asyncio.get_running_loop().time()
        during = await pool.health()
        waited = asyncio.get_running_loop().time() - t0
        await job
        return [during["ok"], during["busy"], waited < 0.5, (await pool.health())["busy"]]

    assert asyncio.run(scenario()) == [True, [True], True, [False]]


def test_openai_completions(served):
    client = _client(served)
    out = client.complete("3+4=", max_tokens=4, n=2, temperature=0.0, logprobs=1)
    assert out["object"] == "text_completion" and out["model"] == "tiny" and len(out["choices"]) == 2
    choice = out["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and choice["policy_version"] == 0
    assert len(choice["logprobs"]["tokens"]) == len(choice["logprobs"]["token_logprobs"])
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    assert out["choices"][1]["text"] == choice["text"]  # greedy n=2: the same text twice
    text = choice["text"]
    if text:  # a stop string cuts the text where it starts, and the choice says it stopped
        cut = client.complete("3+4=", max_tokens=4, temperature=0.0, stop=[text[-1]])["choices"][0]
        assert cut["text"] == text[: text.index(text[-1])] and cut["finish_reason"] == "stop"
    with pytest.raises(ServerError, match="echo with logprobs would need the prompt's logprobs"):
        client.complete("3+4=", echo=True, logprobs=1)


def test_async_client(served):
    engines, model = served
    pool = EnginePool(engines, model, timeout_s=60.0, local=True)
    app = make_app(pool, token=None, max_sequences=64, max_body_mb=1.0)

    async def scenario():
        client = AsyncGenerationClient("http://testserver")
        client._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")
        async with client:
            info = await client.info()
            out = await client.generate_ids([PROMPT], n=2, max_tokens=3)
        return info, out

    info, out = asyncio.run(scenario())
    assert info["data_parallel"] == 2 and len(out.completions) == 2


def test_a_server_that_is_not_there_is_one_sentence():
    client = GenerationClient("http://127.0.0.1:9", timeout_s=2.0)
    with pytest.raises(ServerError, match=r"no answer from the rlgen server at http://127.0.0.1:9 to /info .* "
                                          "check that `rlgen serve` is running there") as err:
        client.info()
    assert err.value.status is None


def test_sampling_fields_and_top_logprobs_travel_through_generate(served):
    client = _client(served)
    s = SamplingParams(n=2, max_new_tokens=5, seed=4, top_k=5, min_p=0.01, repetition_penalty=1.2,
                       frequency_penalty=0.5, presence_penalty=0.5, logit_bias=((1, -100.0),), logprobs=2)
    out = client.generate([GenRequest(tuple(PROMPT), s, 0)])
    for c in out.completions:
        assert len(c.top_logprobs) == len(c.token_ids) and all(len(pos) == 2 for pos in c.top_logprobs)
        assert all(isinstance(t, int) for pos in c.top_logprobs for t in pos)
        assert 1 not in c.token_ids  # banned by logit_bias
    with pytest.raises(ServerError, match="logprobs=99 must be in"):
        client.generate([GenRequest(tuple(PROMPT), SamplingParams(logprobs=99), 0)])
