"""The hf engine's generate_some(): a stopping criterion that ends a generate() call once enough groups are done
(every sample of every request that shares their group id) and every must_finish request is; the rows still
running then stop where they are, and are returned cut short (finish reason "abort")."""

from __future__ import annotations

from typing import Any

import torch

from rlgen.types import GenRequest


class Until:
    """The call's count of finished groups, across the generate() chunks it runs in."""

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


class UntilCriterion:
    """A stopping criterion for one chunk of rows: marks each row done when it samples a stop token or reaches its
    limit, and stops every row once the call's Until is met."""

    def __init__(self, until: Until, rows: list[tuple[int, int]], limits: list[int], stops: set[int], width: int):
        self.until, self.rows, self.limits, self.stops, self.width = until, rows, limits, stops, width
        self.done = [False] * len(rows)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        sampled = input_ids.shape[1] - self.width
        last = input_ids[:, -1].tolist()
        for r, (i, _) in enumerate(self.rows):
            if not self.done[r] and (last[r] in self.stops or sampled >= self.limits[r]):
                self.done[r] = True
                self.until.row_done(i)
        return torch.full((input_ids.shape[0],), self.until.met(), dtype=torch.bool, device=input_ids.device)


__all__ = ["Until", "UntilCriterion"]
