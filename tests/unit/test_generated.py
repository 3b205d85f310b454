"""An engine's generate() result: typed (GenResult) for every engine kind, and whole through the JSON of
`rlgen serve`'s /generate answer."""

from __future__ import annotations

import json

import pytest

from helpers import save_tiny_qwen2
from rlgen.config import EngineConfig
from rlgen.generated import GenResult
from rlgen.types import Completion, GenRequest, SamplingParams


def _result(**kw) -> GenResult:
    comps = [Completion(3, [5, 6], [7, 8, 1], [-0.5, -1.25, -0.125], "stop", 2, [(1, 3)],
                        top_logprobs=[{7: -0.5, 9: -2.0}, {8: -1.25}, {1: -0.125}]),
             Completion(3, [5, 6], [9], [-3.0], "length", 2)]
    return GenResult(completions=comps, version=3, spans=[("generate", 100.0, 101.5), ("env", 101.5, 102.0)], **kw)


@pytest.mark.parametrize("extra", [{}, {"env_s": 0.5}, {"tail_from": 101.25}])
def test_a_result_survives_its_json(extra):
    res = _result(**extra)
    assert GenResult.from_json(json.loads(json.dumps(res.to_json()))) == res


def test_the_json_is_the_servers_answer_and_names_the_engine_when_asked():
    out = _result().to_json(engine=1)
    assert set(out) == {"completions", "spans", "version"}  # env_s and tail_from only where the engine set them
    assert out["spans"][0] == {"engine": 1, "phase": "generate", "start": 100.0, "end": 101.5}
    assert out["completions"][0]["top_logprobs"][0] == {"7": -0.5, "9": -2.0}
    assert GenResult.from_json(out).spans == _result().spans  # the engine's name is the server's, not the result's


def test_the_hf_engine_returns_a_gen_result(tmp_path):
    from rlgen.engines.hf.engine import HFEngine

    path = save_tiny_qwen2(tmp_path, vocab_size=24, eos_token_id=1, pad_token_id=0, max_position_embeddings=64)
    engine = HFEngine(path, EngineConfig(dtype="float32", max_num_seqs=4), seed=0, version=4)
    reqs = [GenRequest((5, 6), SamplingParams(n=2, max_new_tokens=3, ignore_eos=True), 0)]
    for res in (engine.generate(reqs), engine.generate_some(reqs, enough=1)):
        assert isinstance(res, GenResult) and res.version == 4
        assert [len(c.token_ids) for c in res.completions] == [3, 3]
        [(phase, start, end)] = res.spans
        assert phase == "generate" and start <= end and res.tail_from is None and res.env_s == 0.0
    events = list(engine.generate_stream(reqs))
    assert isinstance(events[-1]["final"], GenResult) and len(events[-1]["final"].completions) == 2
