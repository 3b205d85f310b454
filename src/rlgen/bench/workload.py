"""The RL-shaped bench workload: long-tailed per-request lengths, and checks on what came back."""

from __future__ import annotations

import math
from typing import Any

from rlgen.config import BenchConfig
from rlgen.errors import UserError
from rlgen.types import Completion, GenRequest, SamplingParams

GIB = 2**30
ACTOR_TIMEOUT_S = 1800.0
HF_BUDGET_S = 90.0  # hf runs batches until this much generate time is spent (at least one batch)
HF_MEMORY_FRACTION = 0.6  # of the GPU, for the full-vocabulary logits HFEngine keeps per generated token
HF_LOGIT_BYTES = 16.0  # float32 logits per (row, step, vocab entry) at HFEngine's peak: kept, stacked, scaled, log-softmaxed


class BenchError(UserError, RuntimeError):
    """The bench cannot run as configured; the message says why and what to do."""


# -- workload ------------------------------------------------------------------------------------------------
def response_lengths(b: BenchConfig) -> list[int]:
    """Per-prompt max_tokens: lognormal(median, sigma), rounded and clipped; seeded by b.seed."""
    import numpy as np

    rng = np.random.default_rng(b.seed + 1)
    raw = b.response_len_median * np.exp(b.response_len_sigma * rng.standard_normal(b.num_prompts))
    return [int(x) for x in np.clip(np.rint(raw), b.response_len_min, b.response_len_max)]


def make_workload(b: BenchConfig, vocab_size: int) -> list[GenRequest]:
    """The bench's requests: one per prompt, n=samples_per_prompt, sampled at temperature 1."""
    import numpy as np

    if b.num_prompts < 1 or b.samples_per_prompt < 1 or b.prompt_len < 1:
        raise BenchError(
            "bench.num_prompts, bench.samples_per_prompt and bench.prompt_len must be at least 1."
        )
    if not 1 <= b.response_len_min <= b.response_len_max:
        raise BenchError("need 1 <= bench.response_len_min <= bench.response_len_max.")
    rng = np.random.default_rng(b.seed)
    prompts = rng.integers(3, vocab_size, size=(b.num_prompts, b.prompt_len))  # [N, P]; ids 0-2 are special
    lengths = response_lengths(b)
    return [
        GenRequest(
            prompt_ids=tuple(int(t) for t in prompts[i]),
            sampling=SamplingParams(
                n=b.samples_per_prompt, temperature=1.0, top_p=1.0, max_new_tokens=lengths[i], ignore_eos=True
            ),
            group_id=i,
        )
        for i in range(b.num_prompts)
    ]


def workload_summary(requests: list[GenRequest]) -> dict[str, Any]:
    lens = sorted(r.sampling.max_new_tokens for r in requests)
    n = requests[0].sampling.n if requests else 0
    return {
        "prompts": len(requests),
        "samples_per_prompt": n,
        "sequences": sum(r.sampling.n for r in requests),
        "prompt_len": len(requests[0].prompt_ids) if requests else 0,
        "response_tokens": sum(r.sampling.n * r.sampling.max_new_tokens for r in requests),
        "max_tokens_min": lens[0] if lens else 0,
        "max_tokens_median": lens[len(lens) // 2] if lens else 0,
        "max_tokens_mean": sum(lens) / len(lens) if lens else 0,
        "max_tokens_max": lens[-1] if lens else 0,
    }


def check_completions(requests: list[GenRequest], completions: list[Completion]) -> dict[str, Any]:
    """Counts and checks: n per request, lengths equal to max_tokens (ignore_eos), logprobs finite and <= 0."""
    expected = [r.sampling.max_new_tokens for r in requests for _ in range(r.sampling.n)]
    tokens = sum(len(c.token_ids) for c in completions)
    count_ok = len(completions) == len(expected)
    lengths_ok = count_ok and all(len(c.token_ids) == e for c, e in zip(completions, expected))
    lp_ok = all(len(c.logprobs) == len(c.token_ids) for c in completions) and all(
        math.isfinite(x) and x <= 1e-6 for c in completions for x in c.logprobs
    )
    return {
        "tokens": tokens,
        "completions": len(completions),
        "n_ok": count_ok,
        "lengths_ok": lengths_ok,
        "logprobs_ok": lp_ok,
    }


# -- machine facts -------------------------------------------------------------------------------------------
