"""How a metric of one rank's shard becomes the learner group's, declared where the metric is made. A loss's metric
(rlgen.algo.inputs.LossOutputs.metrics) is a plain number, a mean over its micro-batch's response tokens, or a
`Reduced` naming its reduction; the learner's step adds its own keys' and the mismatch's, and sends them with its
metrics (StepResult.reductions), so a new loss's metric reaches metrics.jsonl merged as it says. Pure Python.

Reductions: SUM (the ranks' values added: a loss over the whole batch's denominator, a count), MAX, FIRST (rank 0's:
a value the ranks share, such as the all-reduced gradient norm) and mean_over(count): the ranks' means weighted by
the count each is a mean over (TOKEN_MEAN over response tokens, LOSS_TOKEN_MEAN over the tokens the loss kept,
SEQ_MEAN over sequences with a response token)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

SUM, MAX, FIRST = "sum", "max", "first"
MEAN = "mean:"


def mean_over(count: str) -> str:
    """The reduction of a mean over the metric `count` counts (a key the same metrics hold)."""
    return f"{MEAN}{count}"


TOKEN_MEAN = mean_over("response_tokens")
LOSS_TOKEN_MEAN = mean_over("loss_tokens")
SEQ_MEAN = mean_over("sequences")
# the weights a micro-batch has for its loss metrics' means
MICRO_COUNTS = ("response_tokens", "loss_tokens", "sequences")


class Reduced(float):
    """A metric's value that says how it reduces over micro-batches and ranks: a float (it compares, prints and
    serialises as its value) with `how`."""

    how: str

    def __new__(cls, value: float, how: str = TOKEN_MEAN) -> Reduced:
        obj = super().__new__(cls, value)
        obj.how = how
        return obj

    def __reduce__(self) -> tuple[type, tuple[float, str]]:  # pickled (Ray) with its reduction
        return (Reduced, (float(self), self.how))

    def __repr__(self) -> str:
        return f"Reduced({float(self)!r}, {self.how!r})"


def value_and_how(metric: float | Reduced) -> tuple[float, str]:
    """A loss metric's value and reduction (a plain number: a mean over response tokens)."""
    return float(metric), getattr(metric, "how", TOKEN_MEAN)


def check_reduction(key: str, how: str, counts: Sequence[str] = MICRO_COUNTS) -> None:
    """Raises ValueError, naming the metric, unless how is a reduction over one of counts (or SUM, MAX, FIRST)."""
    if how in (SUM, MAX, FIRST) or (how.startswith(MEAN) and how[len(MEAN):] in counts):
        return
    known = ", ".join([SUM, MAX, FIRST, *(mean_over(c) for c in counts)])
    raise ValueError(f"the loss metric {key!r} reduces by {how!r}; a metric reduces by one of: {known}.")


def merge(per_rank: Sequence[Mapping[str, Any]], reductions: Mapping[str, str]) -> dict[str, Any]:
    """One dict from every rank's, each key by its reduction (a key with none: rank 0's value). A NaN among the
    values of a maximum stays visible; an integer count stays an integer."""
    first = per_rank[0]
    out = dict(first)
    for key, how in reductions.items():
        if key not in first or how == FIRST:
            continue
        values = [float(m[key]) for m in per_rank if key in m]
        if how == SUM:
            value = sum(values)
        elif how == MAX:
            value = math.nan if any(math.isnan(v) for v in values) else max(values)
        else:
            weights = [float(m.get(how[len(MEAN):], 0)) for m in per_rank if key in m]
            total = sum(weights)
            value = values[0] if total <= 0 else sum(v * w for v, w in zip(values, weights) if w > 0) / total
        out[key] = int(value) if isinstance(first[key], int) and not isinstance(first[key], bool) \
            and math.isfinite(value) and how in (SUM, MAX) else value
    return out


class MicroMetrics:
    """A loss's metrics gathered over a step's micro-batches, each by its reduction: the means weighted by each
    micro-batch's count (a mean with no weight at all keeps the first value reported), the maxima over the
    micro-batches with response tokens, sums added, a FIRST kept."""

    def __init__(self) -> None:
        self.hows: dict[str, str] = {}
        self._num: dict[str, float] = {}
        self._den: dict[str, float] = {}
        self._first: dict[str, float] = {}

    def add(self, metrics: Mapping[str, float | Reduced], counts: Mapping[str, float]) -> None:
        """One micro-batch's metrics, with its counts (MICRO_COUNTS: response tokens, loss tokens, sequences).
        Raises ValueError for a reduction over another count, or a metric whose reduction changed."""
        for key, metric in metrics.items():
            value, how = value_and_how(metric)
            check_reduction(key, how)
            if self.hows.setdefault(key, how) != how:
                raise ValueError(f"the loss metric {key!r} reduced by {self.hows[key]!r}, then by {how!r}")
            self._first.setdefault(key, value)
            if how == MAX:
                if counts.get("response_tokens", 0) > 0:
                    old = self._num.get(key, -math.inf)
                    self._num[key] = math.nan if math.isnan(old) or math.isnan(value) else max(old, value)
            elif how == SUM:
                self._num[key] = self._num.get(key, 0.0) + value
            elif how.startswith(MEAN):
                weight = float(counts.get(how[len(MEAN):], 0.0))
                self._num[key] = self._num.get(key, 0.0) + value * weight
                self._den[key] = self._den.get(key, 0.0) + weight

    def values(self) -> dict[str, float]:
        """Each metric over the micro-batches so far."""
        out = {}
        for key, how in self.hows.items():
            if how == FIRST or key not in self._num:
                out[key] = self._first[key]
            elif how.startswith(MEAN):
                out[key] = self._num[key] / self._den[key] if self._den[key] > 0 else self._first[key]
            else:
                out[key] = self._num[key]
        return out


__all__ = ["FIRST", "LOSS_TOKEN_MEAN", "MAX", "MICRO_COUNTS", "Reduced", "SEQ_MEAN", "SUM", "TOKEN_MEAN",
           "MicroMetrics", "check_reduction", "mean_over", "merge", "value_and_how"]
