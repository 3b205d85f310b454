"""The generation tail, measured: how long each engine spent finishing a batch's longest responses (after 90% of
its requests were done, rlgen.types.tail_start) and how much of that time the next batch, launched ahead
(algo.async_steps > 0), was already generating beside them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgen.types import Phase

if TYPE_CHECKING:
    from rlgen.runtime.rollouts.in_flight import InFlight


def tail_metrics(flight: InFlight, following: InFlight | None) -> dict[str, float]:
    """gen/tail_s: the longest tail of the flight's engines; gen/tail_filled: the share of the engines' tail time in
    which the following flight had been launched on the same engine (0 when none was; 1 when it was launched
    before every tail began). {} when no engine reports its tail (engines other than vLLM's)."""
    total = filled = longest = 0.0
    for i, result in flight.results.items():
        start = result.tail_from
        ends = [b for phase, _, b in result.spans if phase == Phase.generate.value]
        if start is None or not ends:
            continue
        end = max(ends)
        tail = max(0.0, end - start)
        longest, total = max(longest, tail), total + tail
        launched = following.launched_at if following is not None and following.shards[i] else None
        if launched is not None:
            filled += max(0.0, end - max(start, launched))
    if not longest and not total:
        return {}
    return {"gen/tail_s": longest, "gen/tail_filled": filled / total if total > 0 else 0.0}


__all__ = ["tail_metrics"]
