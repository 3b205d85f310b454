"""vLLM's batch invariance, as deterministic=true turns it on (VLLM_BATCH_INVARIANT=1 in the engines' environment):
64 prompts sampled alone and inside a larger batch give the same tokens and logprobs, each request with a seed of
its own. The engine runs in a process of its own: the mode changes torch's kernels in the process whose engine
core runs in it. Inside 512, vLLM 0.26 failed this on one H200 (docs/benchmarks.md, 2026-12-04); its fused
residual RMSNorm picks a block size by the step's row count, below and from 256 rows (vllm-project/vllm#48271).
The batch of 255 passed, and so did the batch of 512 on an engine that runs at most 255 sequences a step, which is
how a deterministic plan runs its engines (rlgen.plan.determinism)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ALONE, BATCH, NEW = 64, 512, 48


def _generate(model_path: str, invariant: bool, out: Path, prefix_caching: bool = True, batch: int = BATCH,
              seats: int | None = None) -> None:
    """In the child: the 64 prompts alone, then inside the batch, at temperature 1 with a seed per request (with
    the prefix cache on, the batch finds the 64 prompts' blocks cached by the first call). seats: the engine's
    max_num_seqs, the most sequences it runs at once (None: the whole batch)."""
    import random

    from helpers import SMALL_QWEN2
    from rlgen.config import EngineConfig
    from rlgen.engines.vllm.engine import VLLMEngine
    from rlgen.types import GenRequest, SamplingParams

    env = {"VLLM_BATCH_INVARIANT": "1"} if invariant else {}
    cfg = EngineConfig(kind="vllm", gpu_memory_utilization=0.4, max_model_len=1024, max_num_seqs=seats or batch,
                       enforce_eager=True, dtype="bfloat16", enable_prefix_caching=prefix_caching)
    engine = VLLMEngine(model_path, cfg, device="cuda", seed=0, name="invariance", env=env)
    rng = random.Random(0)
    prompts = [tuple(rng.randrange(3, SMALL_QWEN2["vocab_size"]) for _ in range(rng.randrange(8, 64)))
               for _ in range(BATCH)]

    def requests(k: int) -> list[GenRequest]:
        return [GenRequest(p, SamplingParams(n=1, temperature=1.0, max_new_tokens=NEW, ignore_eos=True, seed=1000 + i),
                           group_id=i) for i, p in enumerate(prompts[:k])]

    alone = engine.generate(requests(ALONE)).completions
    inside = engine.generate(requests(batch)).completions[:ALONE]
    engine.shutdown()
    out.write_text(json.dumps({"alone": [[c.token_ids, c.logprobs] for c in alone],
                               "inside": [[c.token_ids, c.logprobs] for c in inside]}))


def _run(model_path: str, invariant: bool, tmp_path: Path, prefix_caching: bool = True, batch: int = BATCH,
         seats: int | None = None) -> dict:
    out = tmp_path / f"invariant-{invariant}-{prefix_caching}-{batch}-{seats}.json"
    here = Path(__file__).resolve()
    code = (f"import sys; sys.path[:0] = [{str(here.parent.parent)!r}, {str(here.parent)!r}]; "
            f"from test_batch_invariance import _generate; from pathlib import Path; "
            f"_generate({model_path!r}, {invariant}, Path({str(out)!r}), {prefix_caching}, {batch}, {seats})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    from helpers import save_small_qwen2

    return save_small_qwen2(tmp_path_factory.mktemp("qwen2-small"))


# vLLM 0.26 is not batch-invariant with 512 sequences in one engine step (3 of 64 prompts took other tokens on one
# H200, with and without the prefix cache); a deterministic plan caps engine.max_num_seqs at 255, the last case.
# strict: once vLLM holds it at 512, these pass and the cap (rlgen.plan.determinism.INVARIANT_SEATS) can go.
PAST_THE_CAP = pytest.mark.xfail(strict=True, reason="vllm-project/vllm#48271: not invariant from 256 rows a step")


@pytest.mark.parametrize("prefix_caching, batch, seats", [
    pytest.param(True, BATCH, None, id="prefix-cache", marks=PAST_THE_CAP),
    pytest.param(False, BATCH, None, id="no-prefix-cache", marks=PAST_THE_CAP),
    pytest.param(False, 255, None, id="no-prefix-cache-255"),
    pytest.param(True, BATCH, 255, id="prefix-cache-255-seats"),
])
def test_a_prompt_samples_the_same_alone_as_inside_a_batch(model_path, tmp_path, prefix_caching, batch, seats):
    got = _run(model_path, True, tmp_path, prefix_caching, batch, seats)
    assert len(got["alone"]) == len(got["inside"]) == ALONE
    tokens_off = [i for i, (a, b) in enumerate(zip(got["alone"], got["inside"])) if a[0] != b[0]]
    deltas = [(i, t, abs(x - y)) for i, (a, b) in enumerate(zip(got["alone"], got["inside"])) if a[0] == b[0]
              for t, (x, y) in enumerate(zip(a[1], b[1])) if x != y]
    worst = max((d for *_, d in deltas), default=0.0)
    print(f"prefix caching {prefix_caching}, inside {batch} on {seats or batch} seats: {len(tokens_off)} of {ALONE} prompts with other tokens; "
          f"{len(deltas)} of {ALONE * NEW} logprobs differ (max |d| {worst:.3g}) at {deltas[:8]}")
    assert not tokens_off, f"prompts {tokens_off}: other tokens inside the batch"
    assert not deltas, f"{len(deltas)} logprobs differ inside the batch, max |d| {worst:.3g}, first at {deltas[:4]}"
