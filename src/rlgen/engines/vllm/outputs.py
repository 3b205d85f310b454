"""What a vLLM output holds, read into rlgen's shapes: the sampled tokens' logprobs, the top alternatives per
position, and prompt logprobs. No vllm import: these read the objects vLLM returns."""

from __future__ import annotations

from typing import Any

from rlgen.engines.vllm.common import EngineError


def sampled_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    if logprobs is None:
        raise EngineError("vLLM returned no logprobs although logprobs=0 was requested.")
    flat = getattr(logprobs, "logprobs", None)
    if flat is not None and len(flat) == len(token_ids):
        return list(flat)  # one entry per position: the sampled token's
    return [pos[tok].logprob for tok, pos in zip(token_ids, logprobs)]


def top_logprobs(logprobs: Any, k: int, length: int) -> list[dict[int, float]]:
    """Per position, the k most likely tokens (vLLM's ranks 1..k) and their logprobs."""
    if k <= 0 or logprobs is None:
        return []
    return [{int(t): float(lp.logprob) for t, lp in logprobs[i].items() if lp.rank is not None and lp.rank <= k}
            for i in range(length)]


def prompt_logprobs(out: Any) -> list[dict[int, tuple[float, int]] | None]:
    """vLLM's prompt logprobs (asked for with sampling.prompt_logprobs) as {token: (logprob, rank)} per position,
    None at the first."""
    if out.prompt_logprobs is None:
        return []
    return [{int(t): (float(lp.logprob), int(lp.rank)) for t, lp in pos.items()} if pos else None
            for pos in (out.prompt_logprobs[i] for i in range(len(out.prompt_logprobs)))]


__all__ = ["prompt_logprobs", "sampled_logprobs", "top_logprobs"]
