"""A series of step times summed up as throughput: the mean step over the steady steps, the real tokens per second
over them, and how far the steps spread. A median is kept beside them only: where steps alternate between a short
and a long one, the median of such a series lands on either and says nothing of the run's speed.

Steady steps leave out the first ``warmup`` (engines start, the first batch generates alone, the learner compiles)
and the last ``tail`` (with algo.async_steps > 0 nothing generates ahead of a run's last steps). Pure Python."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

SPREAD_LIMIT = 1.5  # the longest steady step at most this many times the shortest: steps that do not alternate


@dataclass(frozen=True)
class Steady:
    """The steady steps of a run, summed up."""

    steps: int  # steady steps counted
    first: int  # index of the first of them in the series given
    mean_s: float  # their total seconds over their count
    min_s: float
    max_s: float
    spread: float  # max_s / min_s: 1 for even steps; 2 and more where they alternate
    cv: float  # the standard deviation of the steps over their mean (0 for one step)
    median_s: float  # beside the mean only
    tokens_per_s: float | None  # the real tokens of the steady steps over their seconds (None: no tokens given)

    @property
    def even(self) -> bool:
        """Whether the longest steady step is within SPREAD_LIMIT of the shortest."""
        return self.spread <= SPREAD_LIMIT

    def to_dict(self) -> dict[str, float | int | bool | None]:
        """The fields, floats rounded to 4 places, and ``even``."""
        out = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        out["even"] = self.even
        return out


def steady(seconds: Sequence[float], tokens: Sequence[float] | None = None, warmup: int = 1,
           tail: int = 0) -> Steady | None:
    """The steady part of a series of step seconds (seconds[i] is step i), with the real tokens of each step where
    given; None where no step is left once warmup and tail are set aside, or a step time is not a positive number.
    Raises ValueError where tokens are given but not one count for each step."""
    if tokens is not None and len(tokens) != len(seconds):
        raise ValueError(f"{len(tokens)} token counts for {len(seconds)} steps")
    end = max(len(seconds) - max(tail, 0), 0)
    first = min(max(warmup, 0), end)
    kept = [float(s) for s in seconds[first:end]]
    if not kept or not all(math.isfinite(s) and s > 0 for s in kept):
        return None
    total = sum(kept)
    mean = total / len(kept)
    cv = statistics.pstdev(kept) / mean if len(kept) > 1 else 0.0
    rate = sum(float(t) for t in tokens[first:end]) / total if tokens is not None else None
    return Steady(len(kept), first, mean, min(kept), max(kept), max(kept) / min(kept), cv, statistics.median(kept),
                  rate)


ALTERNATE_SHARE = 0.8  # of the turns between steps that change direction: steps that alternate
RANGE_CV = 0.25  # steps that do not alternate are said to range only past this coefficient of variation


def uneven_clause(st: Steady | None, times: Sequence[float]) -> str:
    """The clause a verdict over uneven steps (spread past SPREAD_LIMIT) ends with, where their mean hides it:
    they alternate (nearly every step longer than the one before it is followed by a shorter one, and the other
    way round), or they range widely (cv past RANGE_CV). Noise about one time, with a slow step or two among many
    (a checkpoint), says nothing."""
    if st is None or st.even:
        return ""
    turns = [b - a for a, b in zip(times, times[1:])]
    flips = [x * y < 0 for x, y in zip(turns, turns[1:])]
    if flips and sum(flips) >= ALTERNATE_SHARE * len(flips):
        return f" Steps alternate between {st.min_s:.3g} s and {st.max_s:.3g} s, which their mean hides."
    if st.cv > RANGE_CV:
        return f" Steps range from {st.min_s:.3g} s to {st.max_s:.3g} s, which their mean hides."
    return ""


def ratio(a: Steady | None, b: Steady | None) -> float | None:
    """a's mean step over b's (None where either is missing)."""
    if a is None or b is None or b.mean_s <= 0:
        return None
    return a.mean_s / b.mean_s


__all__ = ["ALTERNATE_SHARE", "RANGE_CV", "SPREAD_LIMIT", "Steady", "ratio", "steady", "uneven_clause"]
