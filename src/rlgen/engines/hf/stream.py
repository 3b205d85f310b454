"""Streaming from the hf engine: a transformers streamer that hands each step's sampled tokens of a batch, with
their logprobs, to a callback as they are made, and a stopping criterion that ends generation early when the
call is cancelled (a client that disconnected or timed out). The logprob of each token comes from the lm head's
output at that step, read by a forward hook: the same quantity the engine reports at the end
(log_softmax(logits / T))."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from rlgen.engines.cancel import requested
from rlgen.engines.hf.sampling import top_logprobs

Delta = tuple[int, int, list[int], list[float], list[dict[int, float]]]  # request, sample, tokens, logprobs, tops


class StepStreamer:
    """transformers' streamer protocol (put/end) for a batch of rows, each a (request index, sample index)."""

    def __init__(self, model: Any, rows: list[tuple[int, int]], temperature: float, top: int, stops: set[int],
                 limits: list[int], emit: Callable[[list[Delta]], None]):
        self.rows, self.temperature, self.top, self.stops, self.limits, self.emit = rows, temperature, top, stops, limits, emit
        self.prompt_seen = False
        self.logits: torch.Tensor | None = None
        self.counts = [0] * len(rows)
        self.hook = model.get_output_embeddings().register_forward_hook(self._capture)

    def _capture(self, module: Any, inputs: Any, output: torch.Tensor) -> None:
        self.logits = output[:, -1, :].detach().float()

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate() hands the prompt over first
            self.prompt_seen = True
            return
        tokens = value.reshape(-1).to(torch.long)
        logits = self.logits if self.temperature <= 0 else self.logits / self.temperature
        logp = torch.log_softmax(logits, dim=-1)
        picked = logp.gather(1, tokens.to(logp.device).view(-1, 1)).squeeze(1).tolist()
        tops = top_logprobs(logp.unsqueeze(1), self.top, [1] * len(self.rows))  # per row: [] or [{id: logprob}]
        deltas = []
        for r, (t, lp) in enumerate(zip(tokens.tolist(), picked)):
            if self.counts[r] >= self.limits[r]:
                continue  # this row ended (a stop token, or its own limit) while others go on
            self.counts[r] += 1
            if t in self.stops:
                self.limits[r] = self.counts[r]
            i, j = self.rows[r]
            deltas.append((i, j, [t], [lp], tops[r]))
        if deltas:
            self.emit(deltas)

    def end(self) -> None:
        self.hook.remove()


class Cancelled:
    """A stopping criterion: every row is done once ``event`` is set or the call is cancelled
    (rlgen.engines.cancel: a Ray task cancelled, or an in-process call's event)."""

    def __init__(self, event: threading.Event | None):
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), requested(self.event), dtype=torch.bool, device=input_ids.device)


__all__ = ["Cancelled", "Delta", "StepStreamer"]
