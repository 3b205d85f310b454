"""generate_some()'s stop, for every engine that claims CutsShort: a call ends once enough groups are done (every
sample of every request that shares their group id) and every must_finish request is. Pure: no torch."""

from __future__ import annotations

from rlgen.types import GenRequest


class Until:
    """A call's count of finished samples, by group and by must_finish request; row_done(i) as each sample of
    request i ends (the hf engine across the generate() chunks it runs, the vllm engine as each sample's own
    request ends)."""

    def __init__(self, requests: list[GenRequest], enough: int):
        self.group_of = [r.group_id for r in requests]
        self.left: dict[int, int] = {}
        for r in requests:
            self.left[r.group_id] = self.left.get(r.group_id, 0) + r.sampling.n
        self.must = {i: r.sampling.n for i, r in enumerate(requests) if r.must_finish}
        self.enough, self.groups_done = enough, 0

    def row_done(self, request: int) -> None:
        g = self.group_of[request]
        self.left[g] -= 1
        self.groups_done += self.left[g] == 0
        if request in self.must:
            self.must[request] -= 1
            if not self.must[request]:
                del self.must[request]

    def met(self) -> bool:
        return self.groups_done >= self.enough and not self.must

    def needs(self, rows: list[tuple[int, int]]) -> bool:
        """Whether a chunk of (request, sample) rows must still run."""
        return not self.met() or any(i in self.must for i, _ in rows)


__all__ = ["Until"]
