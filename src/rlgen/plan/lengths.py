"""RL-shaped lengths in the prediction: geometric response lengths of a mean m cut at the cap (what
task.response_length_mean gives a random-weight model, and how real RL lengths look). Pure arithmetic."""

from __future__ import annotations

import math


def shaped_mean(mean: float, cap: int) -> float:
    """The mean of geometric lengths of this mean cut at cap: m x (1 - exp(-cap / m))."""
    return mean * (1 - math.exp(-cap / mean))


def longest_response(mean: float, n: int, cap: int) -> float:
    """The expected longest of n geometric lengths of this mean, cut at cap: mean x H(n), H(n) ~ ln n + 0.577."""
    return min(float(cap), mean * (math.log(max(n, 1)) + 0.5772))


def awaited_response(mean: float, n: int, cap: int, group: int = 1, share: float = 0.0) -> float:
    """The decode steps a batch's generation waits for: its longest of n responses, or with partial rollouts
    (algo.partial_rollouts=share > 0) until 1 / (1 + share) of its groups (of `group` samples) are done, the
    quantile q of a group's longest, (1 - exp(-x / mean))^group = q."""
    if share <= 0:
        return longest_response(mean, n, cap)
    q = 1.0 / (1.0 + share)
    return min(float(cap), -mean * math.log(1.0 - q ** (1.0 / max(group, 1))))


def shaped_decode_s(weights_s: float, per_seq_s: float, seqs: int, resp: float, mean: float, cap: int,
                    concurrency: int, group: int = 1, share: float = 0.0) -> float:
    """A batch of seqs sequences of mean length resp decodes until its longest ends (with partial rollouts: until
    the groups it trains are done, awaited_response), fewer sequences a step as the others finish: each step
    reads the weights once (weights_s), each sequence in flight adds per_seq_s, and no step holds more than
    concurrency sequences."""
    tokens = seqs * resp
    steps = max(awaited_response(mean, seqs, cap, group, share), tokens / max(concurrency, 1))
    return steps * weights_s + tokens * per_seq_s


__all__ = ["awaited_response", "longest_response", "shaped_decode_s", "shaped_mean"]
