"""Each learner rank's share of a step's batch: which rows it trains on, of equal estimated work, in micro-batches
of at most algo.micro_batch_tokens packed tokens, as many on every rank (rlgen.microbatches). Rows are shared out
over the learner mesh's data ranks (rlgen.mesh): the ranks of a sequence group train the same rows, and their lead
answers for them. The advantages phase asks the ranks for their rows' KL with it, and the train phase trains them
on it."""

from __future__ import annotations

from typing import TypeVar

from rlgen.mesh import LearnerMesh
from rlgen.microbatches import Assignment
from rlgen.runtime.setup import Run
from rlgen.types import RolloutBatch

T = TypeVar("T")


def assign_rows(run: Run, rows: RolloutBatch) -> Assignment:
    """Which rows each learner rank trains on, and in which micro-batches."""
    from rlgen.learners.packed import row_tokens
    from rlgen.microbatches import assign, attention_coef

    m = run.cfg.model
    tokens = row_tokens(rows.attention_mask, rows.response_mask, rows.prompt_len)
    return assign(tokens, run.plan.mesh.data, int(run.cfg.algo.micro_batch_tokens or 0),
                  attention_coef(m.num_layers, m.hidden_size, run.plan.model.params))


def shards(rows: RolloutBatch, assignment: Assignment, mesh: LearnerMesh) -> list[RolloutBatch]:
    """Each learner rank's rows of the batch, with its micro-batches (copies: taken after the rows are final); the
    ranks of a sequence group get the same ones."""
    import torch

    out = []
    for data_rank in range(len(assignment.ranks)):
        shard = rows.select(torch.tensor(assignment.rows(data_rank), dtype=torch.long))
        shard.micro_rows = assignment.local(data_rank)
        out.extend([shard] * mesh.sequence)
    return out


def leads(per_rank: list[T], mesh: LearnerMesh) -> list[T]:
    """What each data shard's lead rank answered, in data-rank order (its sequence group's peers answer the same)."""
    return [per_rank[r] for r in mesh.leaders()]


def rank_names(run: Run) -> list[str]:
    """learner0, learner1, ...: the ranks as waits and the timeline name them."""
    return [f"learner{r}" for r in range(len(run.learners))]


__all__ = ["assign_rows", "leads", "rank_names", "shards"]
