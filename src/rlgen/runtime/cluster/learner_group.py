"""The learner ranks as one group, as a step's phases see them: each rank asked to work on its data rank's token
batch (a sequence group's ranks share one), the calls waited for as one (a dead rank is lost at once, a rank left
behind once another finished is hung: ``Waiter.learner_get``), and the answer of each data shard's lead rank (its
sequence group's peers answer the same). The train, KL and teacher phases and the checkpoint and final-weights
saves go through it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from rlgen.mesh import LearnerMesh
from rlgen.runtime.cluster.waits import Waiter

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

T = TypeVar("T")


@dataclass(frozen=True)
class LearnerGroup:
    """ranks: every rank's actor, rank 0 first; nodes: the Ray node of each; hang_s: how long the others may run
    once one rank finished a call with collectives in it."""

    ranks: Sequence[ActorHandle]
    mesh: LearnerMesh
    waiter: Waiter
    nodes: Sequence[str]
    hang_s: float

    @property
    def names(self) -> list[str]:
        """learner0, learner1, ...: the ranks as waits and the timeline name them."""
        return [f"learner{r}" for r in range(len(self.ranks))]

    def for_ranks(self, data_shards: Sequence[T]) -> list[T]:
        """What each rank is sent, in rank order: its data rank's (a sequence group's ranks share one)."""
        return [data_shards[self.mesh.data_rank(r)] for r in range(self.mesh.ranks)]

    def ask(self, method: str, data_shards: Sequence[Any]) -> list[ObjectRef]:
        """method on every rank, each with its data rank's shard; the calls' refs, in rank order."""
        return [getattr(a, method).remote(b) for a, b in zip(self.ranks, self.for_ranks(data_shards))]

    def wait(self, refs: Sequence[ObjectRef[T]], what: str, *, hang: bool = True,
             ranks: Sequence[int] | None = None) -> list[T]:
        """Every rank's answer, in rank order (hang: the call has collectives, so a rank left behind is hung).
        ranks: the rank of each ref where only some were asked (a checkpoint that stand-ins write for lost ranks)."""
        if ranks is None:
            return self.waiter.learner_get(refs, what, self.names, list(self.nodes),
                                           hang_s=self.hang_s if hang else None)
        return self.waiter.learner_get(refs, what, [self.names[r] for r in ranks], [self.nodes[r] for r in ranks],
                                       hang_s=self.hang_s if hang else None, ranks=list(ranks))

    def leads(self, per_rank: Sequence[T]) -> list[T]:
        """What each data shard's lead rank answered, in data-rank order."""
        return [per_rank[r] for r in self.mesh.leaders()]


__all__ = ["LearnerGroup"]
