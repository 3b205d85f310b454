"""The hf engine's generate_some(): a stopping criterion that ends a generate() call once its Until is met
(rlgen.engines.cut_short); the rows still running then stop where they are, and are returned cut short (finish
reason "abort")."""

from __future__ import annotations

from typing import Any

import torch

from rlgen.engines.cut_short import Until


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


__all__ = ["UntilCriterion"]
