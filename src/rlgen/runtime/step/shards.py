"""Each learner rank's share of a step's batch: which rows it trains on, of equal estimated work, in micro-batches
of at most algo.micro_batch_tokens packed tokens, as many on every rank (rlgen.microbatches). The advantages phase
asks the ranks for their rows' KL with it, and the train phase trains them on it."""

from __future__ import annotations

from rlgen.microbatches import Assignment
from rlgen.runtime.setup import Run
from rlgen.types import RolloutBatch


def assign_rows(run: Run, rows: RolloutBatch) -> Assignment:
    """Which rows each learner rank trains on, and in which micro-batches."""
    from rlgen.learners.packed import row_tokens
    from rlgen.microbatches import assign, attention_coef

    m = run.cfg.model
    tokens = row_tokens(rows.attention_mask, rows.response_mask, rows.prompt_len)
    return assign(tokens, len(run.learners), int(run.cfg.algo.micro_batch_tokens or 0),
                  attention_coef(m.num_layers, m.hidden_size, run.plan.model.params))


def shards(rows: RolloutBatch, assignment: Assignment) -> list[RolloutBatch]:
    """Each learner rank's rows of the batch, with its micro-batches (copies: taken after the rows are final)."""
    import torch

    out = []
    for rank in range(len(assignment.ranks)):
        shard = rows.select(torch.tensor(assignment.rows(rank), dtype=torch.long))
        shard.micro_rows = assignment.local(rank)
        out.append(shard)
    return out


def rank_names(run: Run) -> list[str]:
    """learner0, learner1, ...: the ranks as waits and the timeline name them."""
    return [f"learner{r}" for r in range(len(run.learners))]


__all__ = ["assign_rows", "rank_names", "shards"]
