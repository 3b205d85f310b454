"""The hf engine honours the sampling options and reports the logprobs the learner recomputes."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import save_tiny_qwen2
from rlgen.config import EngineConfig
from rlgen.engines.hf.engine import HFEngine
from rlgen.runtime.rollouts.batch import build_batch
from rlgen.types import Completion, GenRequest, SamplingParams

EOS = 1


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> HFEngine:
    path = save_tiny_qwen2(tmp_path_factory.mktemp("tiny"), vocab_size=24, eos_token_id=EOS, pad_token_id=0,
                           max_position_embeddings=64)
    return HFEngine(path, EngineConfig(dtype="float32", max_num_seqs=16), seed=0)


def _req(prompt, gid, **kw) -> GenRequest:
    return GenRequest(tuple(prompt), SamplingParams(**kw), gid)


def test_n_lengths_and_order(engine):
    reqs = [
        _req([5, 6, 7], 0, n=3, max_new_tokens=5, ignore_eos=True),
        _req([8], 1, n=2, max_new_tokens=2, ignore_eos=True),
    ]
    out = engine.generate(reqs)
    comps = out.completions
    assert [c.group_id for c in comps] == [0, 0, 0, 1, 1]
    assert [len(c.token_ids) for c in comps] == [5, 5, 5, 2, 2]
    assert all(c.finish_reason == "length" for c in comps)
    assert all(len(c.logprobs) == len(c.token_ids) for c in comps)
    assert all(lp <= 0 and math.isfinite(lp) for c in comps for lp in c.logprobs)
    assert out.spans[0][0] == "generate"


def test_stop_token_ends_a_completion(engine):
    # Greedy from this prompt, then make its second token a stop token: generation must end there.
    first = engine.generate([_req([3, 4], 0, temperature=0.0, max_new_tokens=6, ignore_eos=True)]).completions[0]
    stop = first.token_ids[1]
    again = engine.generate([_req([3, 4], 0, temperature=0.0, max_new_tokens=6, stop_token_ids=(stop,))])
    c = again.completions[0]
    assert c.token_ids == first.token_ids[: first.token_ids.index(stop) + 1]
    assert c.finish_reason == "stop"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_teacher_forced_scores(engine, temperature):
    reqs = [_req([5, 6, 7, 9], 0, n=4, temperature=temperature, max_new_tokens=6), _req([2, 11], 1, n=4,
            temperature=temperature, max_new_tokens=6)]
    comps = engine.generate(reqs).completions
    scored = engine.score([c.prompt_ids for c in comps], [c.token_ids for c in comps], temperature)
    for c, s in zip(comps, scored):
        assert c.logprobs == pytest.approx(s, abs=1e-4)


def test_same_seed_same_samples(engine):
    # A seeded request gives the same samples on every call: a re-sent request (an engine restarted mid-step)
    # or a resumed run reproduces the completions exactly.
    reqs = [_req([5, 6], 0, n=4, max_new_tokens=6, seed=7, ignore_eos=True)]
    a = [c.token_ids for c in engine.generate(reqs).completions]
    b = [c.token_ids for c in engine.generate(reqs).completions]
    assert a == b
    assert len({tuple(t) for t in a}) > 1  # the n samples differ from each other
    other = [c.token_ids for c in engine.generate([_req([5, 6], 0, n=4, max_new_tokens=6, seed=8, ignore_eos=True)]).completions]
    assert other != a


def test_unseeded_requests_vary_from_call_to_call(engine):
    reqs = [_req([5, 6], 0, n=4, max_new_tokens=6, seed=None, ignore_eos=True)]
    a = [c.token_ids for c in engine.generate(reqs).completions]
    b = [c.token_ids for c in engine.generate(reqs).completions]
    assert a != b


def test_update_weights_changes_outputs_and_version(engine):
    greedy = [_req([5, 6, 7], 0, temperature=0.0, max_new_tokens=6, ignore_eos=True)]
    before = engine.generate(greedy).completions[0].token_ids
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    noisy = {k: v + 0.5 * torch.randn_like(v) for k, v in state.items()}
    res = engine.update_weights(noisy, version=3)
    assert res["version"] == 3 and engine.health()["version"] == 3
    assert engine.generate(greedy).completions[0].token_ids != before
    engine.update_weights(state, version=4)
    assert engine.generate(greedy).completions[0].token_ids == before


def test_build_batch_layout():
    comps = [
        Completion(1, [4, 5], [7, 1], [-0.5, -0.25], "stop", 2),
        Completion(0, [3], [8, 9, 10], [-1.0, -2.0, -3.0], "length", 3),
    ]
    b = build_batch(comps, [1.0, 0.0], pad_id=0)
    assert b.prompt_len == 2 and b.version == 2
    assert b.group_ids.tolist() == [0, 1]  # sorted by group
    assert b.input_ids.tolist() == [[0, 3, 8, 9, 10], [4, 5, 7, 1, 0]]
    assert b.attention_mask.tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert b.response_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert b.engine_logprobs.tolist() == [[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]]
    assert b.rewards.tolist() == [0.0, 1.0]
    assert b.num_response_tokens == 5
