"""Rows to learner ranks and micro-batches (rlgen.microbatches): every row once, a token budget held, ranks of
equal work and of as many micro-batches."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlgen.microbatches import assign, attention_coef, chunk_tokens, work


def geometric(n: int, mean: float, cap: int, seed: int) -> list[int]:
    """RL-shaped row lengths: a prompt of 64 plus a geometric response of this mean, cut at the cap."""
    rng = random.Random(seed)
    return [64 + min(cap, 1 + int(rng.expovariate(1 / mean))) for _ in range(n)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=300), st.integers(1, 8), st.integers(0, 20000))
def test_every_row_once_budget_held_equal_micro_batches(tokens, ranks, budget):
    if len(tokens) < ranks:
        with pytest.raises(ValueError, match="cannot give each"):
            assign(tokens, ranks, budget)
        return
    a = assign(tokens, ranks, budget)
    assert sorted(r for rank in range(ranks) for r in a.rows(rank)) == list(range(len(tokens)))
    counts = {len(rank) for rank in a.ranks}
    assert len(counts) == 1  # as many micro-batches on every rank
    assert all(m for rank in a.ranks for m in rank)  # none empty
    fewest = min(sum(len(m) for m in rank) for rank in a.ranks)
    for rank in a.ranks:
        for m in rank:
            # over the budget only alone, or where a rank has too few rows for more micro-batches
            assert budget == 0 or sum(tokens[i] for i in m) <= budget or len(m) == 1 or a.micro_batches == fewest
    if budget == 0:
        assert a.micro_batches == 1


def test_rl_lengths_fill_the_budget_and_split_the_work_evenly():
    tokens = geometric(512, 250, 2048, 0)
    coef = attention_coef(28, 1536, 1_543_714_304)
    a = assign(tokens, 4, 32768, coef)
    loads = [sum(work(tokens[i], coef) for i in a.rows(r)) for r in range(4)]
    assert max(loads) / min(loads) < 1.01  # 512 rows of a long-tailed length: the ranks' work within 1%
    per_micro = [sum(tokens[i] for i in m) for rank in a.ranks for m in rank]
    assert max(per_micro) <= 32768
    total = sum(tokens)
    assert a.micro_batches == -(-total // (4 * 32768))  # no more micro-batches than the tokens need
    rows = [len(a.rows(r)) for r in range(4)]
    assert max(rows) != min(rows) or max(loads) / min(loads) < 1.01  # equal work, not necessarily equal rows


def test_long_rows_go_alone_and_ranks_balance_estimated_flops():
    # one 32k row and many short ones: attention makes the long row's work more than its tokens
    tokens = [32_000] + [500] * 127
    coef = attention_coef(28, 1536, 1_543_714_304)
    a = assign(tokens, 2, 33_792, coef)
    (long_rank,) = [r for r in range(2) if 0 in a.rows(r)]
    loads = [sum(work(tokens[i], coef) for i in a.rows(r)) for r in range(2)]
    assert max(loads) / min(loads) < 1.05
    assert len(a.rows(long_rank)) < len(a.rows(1 - long_rank))  # it holds fewer rows for the same work
    assert any(m == (0,) or 0 in m and sum(tokens[i] for i in m) <= 33_792 for m in a.ranks[long_rank])


def test_local_indices_follow_rows_order():
    a = assign([5, 4, 3, 2, 1, 9], 2, 10)
    for rank in range(2):
        rows = a.rows(rank)
        assert [[rows[i] for i in m] for m in a.local(rank)] == [list(m) for m in a.ranks[rank]]


def test_lm_head_chunks_hold_half_a_gib_of_fp32_logits():
    assert chunk_tokens(151_936) == 883 and chunk_tokens(32) > 10**6


def test_values_given_per_rank_come_back_in_the_batch_order():
    # the reference KL of each sequence (algo.kl_penalty=reward) comes back from each rank for its own rows
    tokens = [9, 1, 7, 3, 5, 2, 8]
    a = assign(tokens, 3, 0)
    per_rank = [[float(tokens[r]) * 10 for r in a.rows(rank)] for rank in range(3)]
    assert a.gather(per_rank) == [t * 10.0 for t in tokens]
    with pytest.raises(ValueError, match="rank 0 gave 1 values"):
        a.gather([[1.0], *per_rank[1:]])
