"""Each learner rank's share of a step's batch: which rows it trains on, of equal estimated work, in micro-batches
of at most algo.micro_batch_tokens packed tokens, as many on every rank (rlgen.microbatches), built once into a
token batch per data rank (rlgen.learners.token_batch). Rows are shared out over the learner mesh's data ranks
(rlgen.mesh): the ranks of a sequence group train the same token batch, and their lead answers for them
(rlgen.runtime.cluster.learner_group). The advantages phase asks the ranks for their rows' KL with them, and the
train phase trains them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgen.mesh import LearnerMesh
from rlgen.microbatches import Assignment
from rlgen.runtime.run_handle import Run
from rlgen.types import RolloutBatch

if TYPE_CHECKING:
    import torch

    from rlgen.learners.token_batch import TokenBatch

def assign_rows(run: Run, rows: RolloutBatch) -> Assignment:
    """Which rows each learner rank trains on, and in which micro-batches."""
    from rlgen.learners.packed import row_tokens
    from rlgen.microbatches import assign, attention_coef

    m = run.cfg.model
    tokens = row_tokens(rows.attention_mask, rows.response_mask, rows.prompt_len)
    return assign(tokens, run.plan.mesh.data, int(run.cfg.algo.micro_batch_tokens or 0),
                  attention_coef(m.num_layers, m.hidden_size, run.plan.model.params))


def shards(rows: RolloutBatch, assignment: Assignment, mesh: LearnerMesh) -> list[TokenBatch]:
    """Each data rank's token batch (rlgen.learners.token_batch): its rows packed once, in its micro-batches,
    padded for the mesh's sequence degree; in data-rank order. The learners train them as sent."""
    import torch

    from rlgen.learners.token_batch import token_batch

    return [token_batch(rows.select(torch.tensor(assignment.rows(d), dtype=torch.long)), assignment.local(d),
                        degree=mesh.sequence) for d in range(len(assignment.ranks))]


def with_advantages(data_shards: list[TokenBatch], rows: RolloutBatch, assignment: Assignment,
                    terms: list[torch.Tensor] | None = None) -> list[TokenBatch]:
    """The data ranks' token batches with their rows' advantages, as computed over the whole batch, and each
    rank's per-token term where given (on-policy distillation's, [N_d, L_d])."""
    import torch

    return [b.with_advantages(rows.advantages[torch.tensor(assignment.rows(d), dtype=torch.long)],
                              None if terms is None else terms[d])
            for d, b in enumerate(data_shards)]


__all__ = ["assign_rows", "shards", "with_advantages"]
