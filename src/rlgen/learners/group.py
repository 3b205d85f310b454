"""A learner of several ranks, as the driver sees it: where rank 0 listens, and one metrics dict from the ranks'
dicts (rlgen.microbatches says which rows each rank trains on). Imports neither torch nor Ray at module level."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

from rlgen.metrics.reduce import MAX, SUM, mean_over, merge
from rlgen.types import StepResult


class CollectiveFailed(RuntimeError):
    """A collective of the learner group did not complete on this rank: timed_out when it waited
    runtime.hang_timeout_s for a peer, else it failed at once (a peer's connection closed)."""

    def __init__(self, rank: int, operation: str, timed_out: bool, detail: str) -> None:
        self.rank, self.operation, self.timed_out, self.detail = rank, operation, timed_out, detail
        how = "timed out" if timed_out else "failed"
        super().__init__(f"learner rank {rank}: {operation} {how} ({detail})")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses Ray as the same exception
        return (CollectiveFailed, (self.rank, self.operation, self.timed_out, self.detail))


def free_endpoint(local: bool = False) -> tuple[str, int]:
    """This host's address (127.0.0.1 when local) and a port free right now, for a rendezvous."""
    if local:
        host = "127.0.0.1"
    else:
        import ray

        host = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind(("", 0))
        return host, int(s.getsockname()[1])


BY_LENGTH = "mismatch/by_length/"  # mismatch/by_length/<bucket>/<stat> (rlgen.metrics.mismatch.mismatch_by_length)


def _by_length(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The mismatch by response length over the ranks: each bucket any rank has, over the ranks that have it, its
    tokens summed, its maximum the largest and its means weighted by each rank's tokens in it."""
    out: dict[str, Any] = {}
    buckets = dict.fromkeys(k[len(BY_LENGTH):].rsplit("/", 1)[0] for m in per_rank for k in m if k.startswith(BY_LENGTH))
    for bucket in buckets:
        key = f"{BY_LENGTH}{bucket}/"
        ranks = [{k: v for k, v in m.items() if k.startswith(key)} for m in per_rank if f"{key}tokens" in m]
        by = mean_over(f"{key}tokens")
        out.update(merge(ranks, {f"{key}tokens": SUM, f"{key}max_abs_delta": MAX, f"{key}k3_kl": by,
                                 f"{key}mean_abs_delta": by}))
    return out


def merge_rank_metrics(per_rank: Sequence[dict[str, Any]], reductions: Mapping[str, str]) -> dict[str, Any]:
    """One metrics dict from every rank's (StepResult.metrics): each key by the reduction its maker declared
    (StepResult.reductions, rlgen.metrics.reduce): each rank reports its shard with the whole batch's loss
    denominator, so losses add up; means are weighted by the count they average over; maxima are maxima; a key
    without one (grad_norm: DeepSpeed reduces it) is rank 0's. The mismatch by length merges bucket by bucket."""
    if not per_rank:
        raise ValueError("no rank reported")
    if len(per_rank) == 1:
        return dict(per_rank[0])
    return {**merge(per_rank, reductions), **_by_length(per_rank)}


def merge_results(per_rank: Sequence[StepResult]) -> StepResult:
    """One step's result from every rank's (one per data shard: a sequence group's peers answer as its lead):
    the metrics merged (merge_rank_metrics), the version rank 0's (the ranks step together), skipped where any rank
    skipped, with the first reason (an fp16 overflow where every skipping rank overflowed). Spans and RNG digests
    are each rank's own and left out."""
    if not per_rank:
        raise ValueError("no rank reported")
    reason = next((r.skip_reason for r in per_rank if r.skip_reason is not None), None)
    return StepResult(version=per_rank[0].version, skip_reason=reason, spans=(),
                      metrics=merge_rank_metrics([r.metrics for r in per_rank], per_rank[0].reductions),
                      reductions=per_rank[0].reductions,
                      overflow=reason is not None and all(r.overflow for r in per_rank if r.skip_reason is not None))


__all__ = ["CollectiveFailed", "free_endpoint", "merge_rank_metrics", "merge_results"]
