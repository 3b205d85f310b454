"""The hf engine's sampling settings as transformers' generate() arguments: temperature, top-p, top-k, min-p,
repetition penalty and logit bias are generate()'s own; frequency and presence penalties (which it lacks) are
one logits processor. Greedy requests use none of the random ones."""

from __future__ import annotations

from typing import Any

import torch

from rlgen.types import SamplingParams


class FrequencyPresencePenalty:
    """OpenAI's penalties on the tokens generated so far: the logit of a token that appeared c times drops by
    frequency x c, plus presence once if c > 0."""

    def __init__(self, prompt_width: int, frequency: float, presence: float):
        self.start, self.frequency, self.presence = prompt_width, frequency, presence

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.start :]
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def generate_kwargs(s: SamplingParams, prompt_width: int) -> dict[str, Any]:
    """generate()'s sampling arguments for one group of rows that share ``s``."""
    from transformers import LogitsProcessorList

    greedy = s.temperature <= 0
    out: dict[str, Any] = {
        "do_sample": not greedy,
        "temperature": None if greedy else s.temperature,
        "top_p": None if greedy or s.top_p >= 1 else s.top_p,
        "top_k": None if greedy else s.top_k,  # 0: no cut, so the sampled distribution is the one reported
        "min_p": None if greedy or not s.min_p else s.min_p,
        "repetition_penalty": s.repetition_penalty if s.repetition_penalty != 1.0 else None,
        "sequence_bias": {(t,): b for t, b in s.logit_bias} or None,
    }
    if s.frequency_penalty or s.presence_penalty:
        out["logits_processor"] = LogitsProcessorList(
            [FrequencyPresencePenalty(prompt_width, s.frequency_penalty, s.presence_penalty)])
    return out


def top_logprobs(logp: torch.Tensor, k: int, lengths: list[int]) -> list[list[dict[int, float]]]:
    """Per row, per returned token, the k most likely tokens and their logprobs (logp: [N, L, V])."""
    if k <= 0:
        return [[] for _ in lengths]
    values, ids = logp.topk(k, dim=-1)
    return [[dict(zip(ids[r, t].tolist(), values[r, t].tolist())) for t in range(n)] for r, n in enumerate(lengths)]


def ranked_logprobs(logp: torch.Tensor, targets: list[int], k: int) -> list[dict[int, tuple[float, int]]]:
    """Per position (logp: [T, V], the distribution each target was drawn from), {token: (logprob, rank)} for the k
    most likely tokens (all of them when k is -1) and the target, rank 1 the most likely: vLLM's prompt_logprobs."""
    k = logp.shape[-1] if k < 0 else min(k, logp.shape[-1])
    values, ids = logp.topk(k, dim=-1)
    target = torch.tensor(targets, dtype=torch.long, device=logp.device)
    chosen = logp.gather(-1, target[:, None]).squeeze(-1)  # [T]
    ranks = (logp > chosen[:, None]).sum(-1) + 1
    out = []
    for t, token in enumerate(targets):
        entry = {i: (v, r) for r, (i, v) in enumerate(zip(ids[t].tolist(), values[t].tolist()), start=1)}
        entry[token] = (float(chosen[t]), int(ranks[t]))
        out.append(entry)
    return out
