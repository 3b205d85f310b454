"""VLLMEngine on a GPU: lengths and n, logprobs, weight updates, pause/resume, sleep.

One small random-init Qwen2 model and one engine (eager, so it starts fast) serve the whole module.
"""

from __future__ import annotations

import threading
import time

import pytest

from helpers import SMALL_QWEN2, save_small_qwen2
from rlgen.config import EngineConfig
from rlgen.types import GenRequest, SamplingParams

pytestmark = pytest.mark.gpu

VOCAB = SMALL_QWEN2["vocab_size"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return save_small_qwen2(tmp_path_factory.mktemp("qwen2-small"))


@pytest.fixture(scope="module")
def engine(model_path):
    from rlgen.engines.vllm.engine import VLLMEngine

    cfg = EngineConfig(
        kind="vllm",
        gpu_memory_utilization=0.4,
        max_model_len=1024,
        max_num_seqs=64,
        enforce_eager=True,
        enable_sleep_mode=True,
        dtype="bfloat16",  # as the plan resolves engine.dtype (null) for precision=bf16: updates cast to it on the wire
    )
    eng = VLLMEngine(model_path, cfg, device="cuda", seed=0, name="test-engine")
    yield eng
    eng.shutdown()


def _prompts(k: int, length: int = 12, seed: int = 0) -> list[tuple[int, ...]]:
    import random

    rng = random.Random(seed)
    return [tuple(rng.randrange(3, VOCAB) for _ in range(length)) for _ in range(k)]


def _greedy(engine, prompts, max_new: int = 24) -> list[list[int]]:
    reqs = [
        GenRequest(
            p, SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new, ignore_eos=True), group_id=i
        )
        for i, p in enumerate(prompts)
    ]
    return [c.token_ids for c in engine.generate(reqs).completions]


def _weights(model_path: str) -> dict:
    from pathlib import Path

    from safetensors.torch import load_file

    out = {}
    for f in sorted(Path(model_path).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_health(engine):
    h = engine.health()
    assert h["ok"] and h["version"] == 0 and not h["asleep"]
    assert h["start_s"] > 0


def test_lengths_and_n_honoured(engine):
    shapes = [(1, 1), (2, 7), (4, 33), (3, 100), (1, 250)]  # (n, max_new_tokens)
    prompts = _prompts(len(shapes), seed=1)
    reqs = [
        GenRequest(
            p, SamplingParams(n=n, temperature=1.0, max_new_tokens=m, ignore_eos=True), group_id=10 + i
        )
        for i, (p, (n, m)) in enumerate(zip(prompts, shapes))
    ]
    out = engine.generate(reqs)
    comps = out.completions
    assert len(comps) == sum(n for n, _ in shapes)
    expected = [(10 + i, m) for i, (n, m) in enumerate(shapes) for _ in range(n)]
    assert [(c.group_id, len(c.token_ids)) for c in comps] == expected
    assert all(c.finish_reason == "length" and c.version == 0 for c in comps)
    assert all(list(c.prompt_ids) == list(reqs[c.group_id - 10].prompt_ids) for c in comps)
    ((phase, start, end),) = out.spans
    assert phase == "generate" and end > start


def test_stop_token_ends_a_completion(engine):
    # Sample freely with every token id but a handful as a stop token: completions must end at a stop.
    stops = tuple(range(3, VOCAB - 8))
    reqs = [
        GenRequest(p, SamplingParams(n=2, max_new_tokens=50, stop_token_ids=stops), group_id=i)
        for i, p in enumerate(_prompts(4, seed=2))
    ]
    for c in engine.generate(reqs).completions:
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in stops
        else:
            assert len(c.token_ids) == 50


def test_logprobs_finite_nonpositive_and_match_hf(engine, model_path):
    import math

    from rlgen.engines.hf.engine import HFEngine

    prompts = _prompts(8, seed=3)
    reqs = [
        GenRequest(p, SamplingParams(n=2, max_new_tokens=64, ignore_eos=True), group_id=i)
        for i, p in enumerate(prompts)
    ]
    comps = engine.generate(reqs).completions
    lps = [x for c in comps for x in c.logprobs]
    assert all(len(c.logprobs) == len(c.token_ids) for c in comps)
    assert all(math.isfinite(x) and x <= 1e-6 for x in lps)
    # Teacher-forced logprobs from transformers in bf16 on the same GPU: the engine reports the same quantity.
    ref = HFEngine(model_path, EngineConfig(kind="hf", dtype="bfloat16"), device="cuda")
    hf = ref.score([list(c.prompt_ids) for c in comps], [c.token_ids for c in comps])
    deltas = [abs(a - b) for c, h in zip(comps, hf) for a, b in zip(c.logprobs, h)]
    mean = sum(deltas) / len(deltas)
    print(
        f"vllm vs hf sampled-token logprobs: mean |d| {mean:.4f}, max |d| {max(deltas):.4f} over {len(deltas)} tokens"
    )
    assert mean < 0.1 and max(deltas) < 1.0  # bf16 on both sides


def test_prompt_logprobs_match_hf_and_rank_the_prompts_own_tokens(engine, model_path):
    """rlgen serve's prompt_logprobs (TRL's get_sequence_logprobs asks for them): vLLM's per prompt position, in
    the shape the hf engine gives, with the same values to bf16."""
    from rlgen.engines.hf.engine import HFEngine

    prompts = _prompts(4, length=24, seed=5)
    sampling = SamplingParams(n=1, max_new_tokens=1, ignore_eos=True, prompt_logprobs=3)
    reqs = [GenRequest(p, sampling, group_id=i) for i, p in enumerate(prompts)]
    ref = HFEngine(model_path, EngineConfig(kind="hf", dtype="bfloat16"), device="cuda")
    got = engine.generate(reqs).completions
    want = ref.generate(reqs).completions
    deltas = []
    for c, h, p in zip(got, want, prompts):
        assert len(c.prompt_logprobs) == len(p) and c.prompt_logprobs[0] is None
        for t, (pos, hpos) in enumerate(zip(c.prompt_logprobs[1:], h.prompt_logprobs[1:]), start=1):
            own = p[t]
            assert own in pos and len(pos) in (3, 4) and pos[own][1] >= 1  # the top 3 and the prompt's own token
            deltas.append(abs(pos[own][0] - hpos[own][0]))
    print(f"vllm vs hf prompt logprobs: mean |d| {sum(deltas) / len(deltas):.4f}, max |d| {max(deltas):.4f} "
          f"over {len(deltas)} positions")
    assert sum(deltas) / len(deltas) < 0.1 and max(deltas) < 1.0  # bf16 on both sides


def test_weight_update_changes_outputs_and_restores(engine, model_path):
    import torch

    prompts = _prompts(8, seed=4)
    before = _greedy(engine, prompts)
    assert _greedy(engine, prompts) == before  # greedy decoding is repeatable

    original = _weights(model_path)
    emb = original["model.embed_tokens.weight"]
    g = torch.Generator().manual_seed(0)
    noisy = emb + 0.5 * torch.randn(emb.shape, generator=g).to(emb.dtype)
    res = engine.update_weights({"model.embed_tokens.weight": noisy}, version=1)
    assert res["version"] == 1 and engine.health()["version"] == 1
    assert res["tensors"] == 1 and res["prefix_cache_reset"]
    ((phase, start, end),) = res["spans"]
    assert phase == "sync" and end >= start
    changed = _greedy(engine, prompts)
    assert changed != before
    assert all(
        c.version == 1
        for c in engine.generate([GenRequest(prompts[0], SamplingParams(max_new_tokens=4), 0)]).completions
    )

    # Zeroing a whole layer's MLP output also changes outputs.
    zero = {
        "model.layers.1.mlp.down_proj.weight": torch.zeros_like(
            original["model.layers.1.mlp.down_proj.weight"]
        )
    }
    engine.update_weights(zero, version=2)
    assert _greedy(engine, prompts) != before

    # The full original state dict (as a list of pairs, in float32) brings the original outputs back.
    res = engine.update_weights([(k, v.float()) for k, v in original.items()], version=3)
    assert res["tensors"] == len(original)
    assert abs(res["bytes"] - sum(v.numel() * 2 for v in original.values())) == 0  # cast to bf16 on the wire
    assert _greedy(engine, prompts) == before


def test_pause_keeps_requests_and_resume_finishes_them(engine):
    reqs = [
        GenRequest(p, SamplingParams(n=2, max_new_tokens=600, ignore_eos=True), group_id=i)
        for i, p in enumerate(_prompts(8, seed=5))
    ]
    box: dict = {}

    def run():
        box["out"] = engine.generate(reqs)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    engine.pause(mode="keep")
    assert engine.health()["paused"]
    time.sleep(3.0)
    still_running = t.is_alive()
    engine.resume()
    t.join(timeout=120)
    assert not t.is_alive()
    assert still_running, "generation finished while the engine was paused"
    comps = box["out"].completions
    assert [len(c.token_ids) for c in comps] == [600] * 16


def test_sleep_frees_memory_and_wake_restores(engine):
    import torch

    prompts = _prompts(4, seed=6)
    before = _greedy(engine, prompts)
    free0, total = torch.cuda.mem_get_info()
    engine.sleep(level=1)
    assert engine.health()["asleep"]
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate([GenRequest(prompts[0], SamplingParams(max_new_tokens=2), 0)])
    free1, _ = torch.cuda.mem_get_info()
    freed_gib = (free1 - free0) / 2**30
    print(f"sleep(level=1) freed {freed_gib:.1f} GiB of {total / 2**30:.0f} GiB")
    # The engine held about gpu_memory_utilization (0.4) of the GPU, nearly all of it KV cache.
    assert freed_gib > 0.25 * total / 2**30
    engine.wake()
    assert not engine.health()["asleep"]
    assert _greedy(engine, prompts) == before


def test_generate_stream_gives_the_tokens_generate_gives(engine):
    prompts = _prompts(4, seed=7)  # greedy, so n=1 (vLLM takes n > 1 only when sampling)
    reqs = [GenRequest(p, SamplingParams(n=1, temperature=0.0, max_new_tokens=40, ignore_eos=True, logprobs=2),
                       group_id=i) for i, p in enumerate(prompts)]
    streamed: dict[tuple[int, int], list[int]] = {}
    final = None
    for event in engine.generate_stream(reqs):
        if "deltas" in event:
            for i, j, tokens, logprobs, tops in event["deltas"]:
                assert len(tokens) == len(logprobs) == len(tops)
                streamed.setdefault((i, j), []).extend(tokens)
        else:
            final = event["final"]
    assert final is not None and len(final.completions) == 4
    whole = _greedy(engine, prompts, max_new=40)
    for k, c in enumerate(final.completions):
        assert c.token_ids == streamed[(k, 0)] == whole[k]
        assert len(c.top_logprobs) == 40 and all(1 <= len(t) <= 2 for t in c.top_logprobs)


def test_a_cancelled_call_and_a_stream_left_early_stop_generating(engine):
    """A call cancelled through rlgen.engines.cancel (as a Ray cancel or the serve pool would) and a stream
    closed after its first event both end within a second, long before their 900 tokens, and vLLM aborts their
    requests: the engine then answers a new call at once."""
    from rlgen.engines.cancel import CallCancelled, run

    long = [GenRequest(p, SamplingParams(n=8, temperature=1.0, max_new_tokens=900, ignore_eos=True), group_id=i)
            for i, p in enumerate(_prompts(8, seed=8))]
    event, box = threading.Event(), {}

    def call() -> None:
        try:
            box["out"] = run(event, engine.generate, long)
        except CallCancelled as err:
            box["cancelled"] = err

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(0.5)
    t0 = time.time()
    event.set()
    worker.join(10)
    assert "cancelled" in box and time.time() - t0 < 2
    stream = engine.generate_stream(long)
    assert "deltas" in next(stream)
    t0 = time.time()
    stream.close()
    assert time.time() - t0 < 2
    t0 = time.time()
    assert [len(t) for t in _greedy(engine, _prompts(2, seed=9), max_new=16)] == [16, 16]
    assert time.time() - t0 < 5  # no aborted request is still decoding in front of it


def test_generate_some_ends_once_enough_groups_are_done_and_cuts_the_rest_short(engine):
    """algo.partial_rollouts' engine call: one short group done, the long ones come back cut short with the tokens
    and logprobs they had; a must_finish request runs to its end."""
    p = _prompts(4, seed=5)
    short = SamplingParams(n=2, max_new_tokens=4, ignore_eos=True, seed=1)
    long = SamplingParams(n=2, max_new_tokens=900, ignore_eos=True, seed=1)
    reqs = [GenRequest(p[0], short, 0), GenRequest(p[1], long, 1), GenRequest(p[2], long, 2),
            GenRequest(p[3], SamplingParams(n=1, max_new_tokens=300, ignore_eos=True, seed=1), 3, must_finish=True)]
    comps = engine.generate_some(reqs, enough=1).completions
    assert [c.group_id for c in comps] == [0, 0, 1, 1, 2, 2, 3]
    assert [c.finish_reason for c in comps[:2]] == ["length", "length"]
    cut = comps[2:6]
    assert all(c.finish_reason == "abort" and len(c.token_ids) < 900 for c in cut)
    assert any(len(c.token_ids) > 0 for c in cut)  # what they had was read from vLLM before the abort
    assert all(len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs) for c in comps)
    assert comps[6].finish_reason == "length" and len(comps[6].token_ids) == 300
    assert engine.health()["ok"]
