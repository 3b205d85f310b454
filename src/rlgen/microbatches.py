"""Which rows each learner rank trains on, and in which micro-batches: the one place a batch's rows become
micro-batches. A micro-batch is a token budget filled from the rows' real lengths (a row is its prompt and
response tokens, no padding), and the ranks get equal work, not equal rows.

Work is a row's estimated training FLOPs up to a constant: its tokens plus ``attention_coef`` times its tokens
squared (the attention scores of a causal sequence grow with its length squared; the rest with its length).
Every rank gets the same number of micro-batches, because a DeepSpeed learner's ranks meet in a collective in
every micro-batch (ZeRO's gradient reduce, and ZeRO-3's parameter gathers). Pure Python: no torch.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

# the most bytes of fp32 logits the learner's LM head makes at once (rlgen.learners.packed: the response tokens'
# logprobs come a chunk at a time); 512 MiB is 883 tokens of a 151,936-token vocabulary
CHUNK_LOGIT_BYTES = 512 * 2**20
TILE_TOKENS = 8192  # a tiled MLP's tile (rlgen.learners.tiling), and the memory model's unit of its activations


def chunk_tokens(vocab: int) -> int:
    """Response tokens per chunk of the LM head."""
    return max(1, CHUNK_LOGIT_BYTES // (4 * max(vocab, 1)))


def attention_coef(num_layers: int, hidden_size: int, params: int) -> float:
    """The work of a row of t tokens is about 6 x params x t (the matmuls) + 6 x layers x hidden x t^2 (causal
    attention, forward and backward): in units of the first, t + coef x t^2 with coef = layers x hidden / params."""
    return num_layers * hidden_size / max(params, 1)


@dataclass(frozen=True)
class Assignment:
    """rank -> micro-batch -> row indices of the batch (ascending within a micro-batch)."""

    ranks: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def micro_batches(self) -> int:
        """Micro-batches per rank (the same on every rank)."""
        return len(self.ranks[0]) if self.ranks else 0

    def rows(self, rank: int) -> list[int]:
        """A rank's rows, in the order its micro-batches take them."""
        return [r for micro in self.ranks[rank] for r in micro]

    def gather(self, per_rank: Sequence[Sequence[float]]) -> list[float]:
        """Values each rank gave for its rows (in rows(rank)'s order), back in the batch's row order."""
        out = [0.0] * sum(len(self.rows(r)) for r in range(len(self.ranks)))
        for rank, values in enumerate(per_rank):
            rows = self.rows(rank)
            if len(values) != len(rows):
                raise ValueError(f"rank {rank} gave {len(values)} values for its {len(rows)} rows")
            for row, value in zip(rows, values):
                out[row] = float(value)
        return out

    def local(self, rank: int) -> list[list[int]]:
        """A rank's micro-batches as indices into its own rows (``rows(rank)``)."""
        out, start = [], 0
        for micro in self.ranks[rank]:
            out.append(list(range(start, start + len(micro))))
            start += len(micro)
        return out


def work(tokens: int, coef: float) -> float:
    return tokens + coef * tokens * tokens


def _spread(items: Sequence[int], weights: Sequence[float], bins: int) -> list[list[int]]:
    """items over `bins` bins, heaviest first, each to the bin with the least weight so far (then the fewest
    items): the greedy longest-processing-time rule, within 4/3 of the best largest bin and close to even when
    items are many and small."""
    heap = [(0.0, 0, b) for b in range(bins)]
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in sorted(items, key=lambda i: (-weights[i], i)):
        load, count, b = heapq.heappop(heap)
        out[b].append(i)
        heapq.heappush(heap, (load + weights[i], count + 1, b))
    return out


def assign(tokens: Sequence[int], ranks: int, budget: int, coef: float = 0.0) -> Assignment:
    """Rows of `tokens[i]` tokens over `ranks` ranks of equal work, then each rank's rows into micro-batches of
    at most `budget` tokens (0: one micro-batch a rank). Every rank gets the same number of micro-batches and
    every micro-batch at least one row; a row longer than the budget is a micro-batch of its own (the plan
    keeps the budget at or above the longest row). Raises ValueError for fewer rows than ranks."""
    n = len(tokens)
    if ranks < 1:
        raise ValueError(f"ranks={ranks} must be at least 1")
    if n < ranks:
        raise ValueError(f"{n} rows cannot give each of {ranks} learner ranks a row")
    weights = [work(int(t), coef) for t in tokens]
    shards = _spread(range(n), weights, ranks)
    size = [float(t) for t in tokens]
    fewest = min(len(s) for s in shards)
    k = 1 if budget <= 0 else max(1, max(math.ceil(sum(size[i] for i in s) / budget) for s in shards))
    while True:
        k = min(k, fewest)
        micros = [_spread(s, size, k) for s in shards]
        over = budget > 0 and any(len(m) > 1 and sum(size[i] for i in m) > budget for rank in micros for m in rank)
        if not over or k == fewest:
            break
        k += 1
    return Assignment(tuple(tuple(tuple(sorted(m)) for m in rank) for rank in micros))


__all__ = ["CHUNK_LOGIT_BYTES", "Assignment", "assign", "attention_coef", "chunk_tokens", "work"]
