"""TRL's own VLLMClient (server mode) against `rlgen serve` on a real socket, over in-process hf engines: health,
models, server info, world size, generation with TRL's fields (answers parsed by TRL's parser: prompt ids,
completion ids, logprobs sorted with their token ids), sequence scores from prompt logprobs, chat, prefix-cache
reset, and the weight-update routes, whose NCCL path hf engines refuse in one sentence. The client's constructor
refuses to run without vLLM, so the test builds it the way the constructor would, then calls TRL's methods
unchanged."""

from __future__ import annotations

import dataclasses
import math

import pytest
import requests

from helpers import serve_in_thread, tiny_pool
from rlgen.serve.app import make_app

trl = pytest.importorskip("trl.generation.vllm_client")


@pytest.fixture(scope="module")
def pool():
    return tiny_pool(chat=True)


@pytest.fixture(scope="module")
def served(pool):
    with serve_in_thread(make_app(pool, token=None, max_sequences=4096, max_body_mb=8.0)) as url:
        yield url, pool.model.tokenizer


@pytest.fixture()
def client(served):
    url, _ = served
    c = object.__new__(trl.VLLMClient)  # what VLLMClient.__init__ sets, less its vLLM import check
    c.session, c.base_url, c.host, c.group_port = requests.Session(), url, "127.0.0.1", 51216
    c.communicator, c._updating_weights = None, False
    c.check_server(total_timeout=10)
    c.model = c._get(f"{url}/v1/models")["data"][0]["id"]
    return c


def test_trl_generates_through_rlgen_serve(client, served):
    _, tok = served
    assert client.model == "tiny" and client.get_world_size() == 2
    prompts = ["3+4=", "12+5="]
    out = client.generate(prompts, n=3, max_tokens=6, temperature=1.0, logprobs=2, generation_kwargs={"seed": 7})
    assert out["prompt_ids"] == [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert len(out["completion_ids"]) == 6 and all(1 <= len(c) <= 6 for c in out["completion_ids"])
    for ids, lps, lp_ids in zip(out["completion_ids"], out["logprobs"], out["logprob_token_ids"]):
        assert len(lps) == len(lp_ids) == len(ids)
        for token, row, row_ids in zip(ids, lps, lp_ids):
            assert token in row_ids and 1 <= len(row) <= 3 and row == sorted(row, reverse=True)
    # seeded through generation_kwargs (one prompt: one engine; in-process engines share torch's generator)
    once, again = (client.generate(prompts[:1], n=3, max_tokens=6, temperature=1.0, generation_kwargs={"seed": 7})
                   for _ in range(2))
    assert again["completion_ids"] == once["completion_ids"]
    plain = client.generate(prompts, n=1, max_tokens=4, logprobs=0)
    assert all(len(row) == 1 for seq in plain["logprobs"] for row in seq)  # the sampled token alone


def test_trl_scores_sequences_with_prompt_logprobs(client, pool):
    """get_sequence_logprobs (distillation's teacher scores): vLLM's prompt_logprobs, the model's own distribution at
    each position after the prompt; the actual token's logprob is the teacher-forced one, and each position's top k
    come sorted, the actual token among them where it is likely enough."""
    seqs, lengths = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14], [20, 21]], [3, 2, 1]
    out = client.get_sequence_logprobs(seqs, lengths, top_logprobs=5)
    reference = pool.engines[0].score([s[:n] for s, n in zip(seqs, lengths)], [s[n:] for s, n in zip(seqs, lengths)])
    for seq, n, actual, ids, tops, top_ids, ref in zip(seqs, lengths, out["actual_logprobs"], out["actual_token_ids"],
                                                        out["logprobs"], out["logprob_token_ids"], reference):
        assert ids == [[t] for t in seq[n:]]
        assert [a[0] for a in actual] == pytest.approx(ref, abs=1e-4)
        for (lp,), token, row, row_ids in zip(actual, seq[n:], tops, top_ids):
            assert len(row) == len(row_ids) == 5 and row == sorted(row, reverse=True) and row[0] >= lp
            assert (token in row_ids) == (lp >= row[-1])
    whole = client.get_sequence_logprobs(seqs[:1], lengths[:1])  # TRL's default top 100, over this 87-token vocabulary
    assert all(len(row) == 100 and row[86] > -math.inf == row[87] for row in whole["logprobs"][0])
    assert all(abs(sum(math.exp(v) for v in row[:87]) - 1) < 1e-3 for row in whole["logprobs"][0])


def test_prompt_logprobs_within_what_the_engines_give(pool):
    """vLLM engines give at most their max_logprobs (20) per position, prompt's too: more is refused in one sentence
    before it reaches them; vLLM's answer reads as the hf engine's."""
    from types import SimpleNamespace as NS

    from rlgen.engines.vllm.outputs import prompt_logprobs
    from rlgen.serve.openai import completions_request
    from rlgen.wire.protocol import BadRequest

    vllm_like = dataclasses.replace(pool.model, max_logprobs=20)
    reqs, _ = completions_request({"prompt": [[5, 6]], "prompt_logprobs": 20}, vllm_like)
    assert reqs[0].sampling.prompt_logprobs == 20
    for asked in (100, -1):
        with pytest.raises(BadRequest, match=rf"prompt_logprobs={asked} is more than this server's engines give "
                                             r"\(vLLM's max_logprobs=20\); ask for 0 to 20"):
            completions_request({"prompt": [[5, 6]], "prompt_logprobs": asked}, vllm_like)
    with pytest.raises(BadRequest, match="prompt_logprobs is not offered with stream=true"):
        completions_request({"prompt": [[5, 6]], "prompt_logprobs": 1, "stream": True}, pool.model)
    answer = NS(prompt_logprobs=[None, {7: NS(logprob=-0.1, rank=1), 9: NS(logprob=-3.0, rank=4)}])
    assert prompt_logprobs(answer) == [None, {7: (-0.1, 1), 9: (-3.0, 4)}]
    assert prompt_logprobs(NS(prompt_logprobs=None)) == []


def test_trl_chat_and_prefix_cache_reset(client):
    out = client.chat([[{"role": "user", "content": "2+2?"}], [{"role": "user", "content": "5+5?"}]], n=2,
                      max_tokens=5, temperature=1.0, logprobs=1)
    assert len(out["prompt_ids"]) == 2 and len(out["completion_ids"]) == 4
    assert all(seq and len(seq) == len(ids) for seq, ids in zip(out["logprobs"], out["completion_ids"]))
    client.reset_prefix_cache()


def test_weight_updates_over_nccl_need_engines_that_take_them(client, served):
    url, _ = served
    with pytest.raises(RuntimeError, match="has no weight-transfer engine"):  # TRL's own check of /server_info
        client.init_communicator("cuda:0")
    assert requests.post(f"{url}/start_weight_update", json={}).json()["version"] == 1
    r = requests.post(f"{url}/update_weights", json={"update_info": {"names": ["w"], "dtype_names": ["bfloat16"],
                                                                     "shapes": [[2]]}})
    assert r.status_code == 409 and "needs engines that take it" in r.json()["error"]["message"]
    assert requests.post(f"{url}/finish_weight_update", json={}).json()["success"]
    bad = requests.post(f"{url}/init_weight_transfer_engine", json={"init_info": {"rank_offset": 1, "world_size": 9}})
    assert bad.status_code == 400 and "this server has 2 workers" in bad.json()["error"]["message"]
