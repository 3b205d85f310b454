"""A learner of several ranks, as the driver sees it: where rank 0 listens, and one metrics dict from the ranks'
dicts (rlgen.microbatches says which rows each rank trains on). Imports neither torch nor Ray at module level."""

from __future__ import annotations

import math
import socket
from collections.abc import Sequence
from typing import Any

from rlgen.types import StepResult

# Keys each rank reports for its own shard, by how the group's value follows from the ranks' values.
SUMMED = ("loss", "pg_loss", "kl", "response_tokens", "sequences", "loss_tokens", "packed_tokens", "mismatch/tokens")
MAXED = ("ratio_max", "mismatch/max_abs_delta", "response_len_max")
# means, and the count each is a mean over
MEANS = {
    "entropy": "response_tokens", "ratio_mean": "response_tokens", "clip_frac": "loss_tokens",
    "tis_frac": "response_tokens", "seq_masked_frac": "sequences", "mismatch/k3_kl": "mismatch/tokens",
    "mismatch/mean_abs_delta": "mismatch/tokens", "mismatch/frac_over_threshold": "mismatch/tokens",
}


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


def _weighted(values: Sequence[float], weights: Sequence[float]) -> float:
    total = sum(weights)
    if total <= 0:
        return values[0]
    return sum(v * w for v, w in zip(values, weights) if w > 0) / total


BY_LENGTH = "mismatch/by_length/"  # mismatch/by_length/<bucket>/<stat> (rlgen.metrics.mismatch.mismatch_by_length)


def _by_length(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The mismatch by response length over the ranks: each bucket any rank has, its tokens summed, its maximum
    the largest and its means weighted by each rank's tokens in it."""
    out: dict[str, Any] = {}
    buckets = dict.fromkeys(k[len(BY_LENGTH):].rsplit("/", 1)[0] for m in per_rank for k in m if k.startswith(BY_LENGTH))
    for bucket in buckets:
        key = f"{BY_LENGTH}{bucket}/"
        ranks = [m for m in per_rank if f"{key}tokens" in m]
        weights = [float(m[f"{key}tokens"]) for m in ranks]
        out[f"{key}tokens"] = int(sum(weights))
        highs = [float(m[f"{key}max_abs_delta"]) for m in ranks]
        out[f"{key}max_abs_delta"] = math.nan if any(math.isnan(v) for v in highs) else max(highs)
        for stat in ("k3_kl", "mean_abs_delta"):
            out[f"{key}{stat}"] = _weighted([float(m[f"{key}{stat}"]) for m in ranks], weights)
    return out


def merge_rank_metrics(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One metrics dict from every rank's (StepResult.metrics): each rank reports its shard with the whole batch's
    loss denominator, so losses add up; means are weighted by the count they average over; maxima are maxima;
    grad_norm is the group's (DeepSpeed reduces it) and taken from rank 0."""
    if not per_rank:
        raise ValueError("no rank reported")
    first = per_rank[0]
    if len(per_rank) == 1:
        return dict(first)
    out = dict(first)
    for key in SUMMED:
        if key in first:
            out[key] = sum(m[key] for m in per_rank)
            if isinstance(first[key], int):
                out[key] = int(out[key])
    for key in MAXED:
        if key in first:
            vals = [float(m[key]) for m in per_rank]
            out[key] = math.nan if any(math.isnan(v) for v in vals) else max(vals)
            if isinstance(first[key], int) and not math.isnan(out[key]):
                out[key] = int(out[key])
    for key, count in MEANS.items():
        if key in first:
            out[key] = _weighted([float(m[key]) for m in per_rank], [float(m.get(count, 0)) for m in per_rank])
    out.update(_by_length(per_rank))
    return out


def merge_results(per_rank: Sequence[StepResult]) -> StepResult:
    """One step's result from every rank's (one per data shard: a sequence group's peers answer as its lead):
    the metrics merged (merge_rank_metrics), the version rank 0's (the ranks step together), skipped where any rank
    skipped, with the first reason (an fp16 overflow where every skipping rank overflowed). Spans and RNG digests
    are each rank's own and left out."""
    if not per_rank:
        raise ValueError("no rank reported")
    reason = next((r.skip_reason for r in per_rank if r.skip_reason is not None), None)
    return StepResult(version=per_rank[0].version, skip_reason=reason, spans=(),
                      metrics=merge_rank_metrics([r.metrics for r in per_rank]),
                      overflow=reason is not None and all(r.overflow for r in per_rank if r.skip_reason is not None))


__all__ = ["CollectiveFailed", "free_endpoint", "merge_rank_metrics", "merge_results"]
