"""The learner's mesh: its ranks as data x sequence (room for a tensor axis later). The plan builds it
(rlgen.plan.mesh), the driver shards rows by it, and each learner rank reads its place in it. Imports nothing.

Ranks are numbered data-major: rank = data_rank * sequence + sequence_rank, so the ranks of one sequence group
are neighbours (on one node wherever the data groups are spread). The ranks of a sequence group train the same
rows, each forwarding its slice of every packed micro-batch's tokens (rlgen.learners.ulysses); the group's
first rank (its lead) counts the group's loss denominator and reports the group's metrics once. Every rank's
gradients are summed over the whole mesh, so each parameter's gradient is exact.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LearnerMesh:
    data: int = 1  # groups of ranks that train different rows
    sequence: int = 1  # ranks in a group, each forwarding a slice of the same rows' tokens

    def __post_init__(self) -> None:
        if self.data < 1 or self.sequence < 1:
            raise ValueError(f"a learner mesh's degrees are at least 1, not data={self.data} "
                             f"sequence={self.sequence}")

    @property
    def ranks(self) -> int:
        """The learner ranks: the product of the degrees."""
        return self.data * self.sequence

    def data_rank(self, rank: int) -> int:
        """Which rows' shard rank trains (rlgen.microbatches' rank)."""
        return rank // self.sequence

    def sequence_rank(self, rank: int) -> int:
        """Which slice of its group's tokens rank forwards."""
        return rank % self.sequence

    def sequence_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that train the same rows as rank, rank among them."""
        first = rank - self.sequence_rank(rank)
        return tuple(range(first, first + self.sequence))

    def sequence_groups(self) -> list[tuple[int, ...]]:
        """Every sequence group, in rank order (the order every rank must create them in)."""
        return [self.sequence_group(d * self.sequence) for d in range(self.data)]

    def leads(self, rank: int) -> bool:
        """Whether rank speaks for its sequence group: counts the group's loss denominator in the gradient
        all-reduce and reports the group's metrics (its peers' are the same)."""
        return self.sequence_rank(rank) == 0

    def leaders(self) -> list[int]:
        """One rank per data shard, in data-rank order."""
        return [d * self.sequence for d in range(self.data)]

    @staticmethod
    def sends_weights(rank: int) -> bool:
        """Whether rank sends the policy to the engines (every rank holds the whole policy after a step)."""
        return rank == 0

    def describe(self) -> str:
        """'data 2 x sequence 2 (4 ranks)', as rlgen plan prints it."""
        return f"data {self.data} x sequence {self.sequence} ({self.ranks} rank{'s' if self.ranks != 1 else ''})"


def head_problem(sequence: int, heads: int, kv_heads: int) -> str | None:
    """Why a sequence-parallel degree cannot split a model's attention heads, with the fix; None where it can.
    Each rank attends with heads / degree query heads, so the degree divides the query heads; key/value heads
    are split the same way, or repeated where the degree is a multiple of their number (fewer KV heads than
    ranks)."""
    if sequence <= 1:
        return None
    fits = [d for d in range(2, heads + 1) if heads % d == 0 and (kv_heads % d == 0 or d % kv_heads == 0)]
    hint = f" (degrees that fit: {', '.join(map(str, fits))})" if fits else ""
    if heads % sequence:
        return (f"learner.sequence_parallel={sequence} does not divide the model's {heads} attention heads; pick "
                f"a degree that does{hint}, or 1.")
    if kv_heads % sequence and sequence % kv_heads:
        return (f"learner.sequence_parallel={sequence} neither divides the model's {kv_heads} key/value heads nor "
                f"is a multiple of them; pick a degree that is{hint}, or 1.")
    return None


__all__ = ["LearnerMesh", "head_problem"]
