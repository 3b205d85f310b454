"""Ulysses sequence parallelism over packed micro-batches: the ranks of a sequence group (rlgen.mesh) each forward
one contiguous slice of a packed row's tokens. Every layer but attention works token by token, so only attention
needs the others' tokens: an all-to-all before it trades each rank's slice of all heads for all tokens of its
share of the heads, the varlen kernel runs over the whole row's boundaries, and an all-to-all after it trades
back (DeepSpeed's Ulysses does the same around HF's own kernels; this one wraps rlgen's varlen backends and runs
over gloo as over NCCL, so CPU tests run the code GPUs run).

Key/value heads fewer than the degree are repeated until each rank has one, which keeps grouped-query attention
exact. The logprobs of the response tokens each rank holds are summed into the whole row's on every rank, so the
loss above is computed whole (and equal) on each rank; its backward passes each rank only its own tokens' part,
so each parameter's gradient, summed over the group, is the unsharded one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlgen.mesh import LearnerMesh


@dataclass(frozen=True)
class SequenceGroup:
    """This rank's sequence group: its torch.distributed process group, the degree and this rank's place."""

    group: Any  # torch.distributed.ProcessGroup
    degree: int
    rank: int  # this rank's place in the group, 0 .. degree-1

    def bounds(self, tokens: int) -> tuple[int, int]:
        """[lo, hi) of this rank's slice of a packed row of tokens (a multiple of degree)."""
        size = tokens // self.degree
        return self.rank * size, (self.rank + 1) * size


def learner_mesh(world_size: int, sequence_parallel: int) -> LearnerMesh:
    """The mesh a learner rank of a group of world_size ranks is part of; ValueError where the degree does not
    divide the ranks (the plan checks it first)."""
    degree = max(int(sequence_parallel), 1)
    if world_size % degree:
        raise ValueError(f"learner.sequence_parallel={degree} does not divide the {world_size} learner ranks")
    return LearnerMesh(world_size // degree, degree)


def join_sequence_groups(groups: list[tuple[int, ...]], rank: int, timeout_s: float) -> SequenceGroup | None:
    """Create every sequence group's process group (each rank creates all of them, in the same order, as
    torch.distributed requires) and return this rank's; None where groups are of one rank."""
    from datetime import timedelta

    import torch.distributed as dist

    if not groups or len(groups[0]) <= 1:
        return None
    mine = None
    for ranks in groups:
        pg = dist.new_group(list(ranks), timeout=timedelta(seconds=float(timeout_s)))
        if rank in ranks:
            mine = SequenceGroup(pg, len(ranks), ranks.index(rank))
    if mine is None:
        raise ValueError(f"rank {rank} is in none of the sequence groups {groups}")
    return mine


def _a2a(x: torch.Tensor, group: Any) -> torch.Tensor:
    """all_to_all_single along dim 0 (degree equal chunks)."""
    import torch.distributed as dist

    x = x.contiguous()
    out = torch.empty_like(x)  # contiguous too: empty_like keeps a transposed input's strides
    dist.all_to_all_single(out, x, group=group)
    return out


def _to_heads(parts: list[torch.Tensor], sg: SequenceGroup) -> list[torch.Tensor]:
    """[T/d, h_i, D] each (this rank's tokens, every head) -> [T, h_i/d, D] each (every token, this rank's share
    of each one's heads), in one all-to-all."""
    d = sg.degree
    t, dim = parts[0].shape[0], parts[0].shape[-1]
    widths = [p.shape[1] // d for p in parts]
    chunks = torch.cat([p.reshape(t, d, w, dim) for p, w in zip(parts, widths)], dim=2)  # [T/d, d, sum w, D]
    got = _a2a(chunks.transpose(0, 1), sg.group)  # [d, T/d, sum w, D]: chunk j came from rank j (its tokens)
    return [x.reshape(d * t, w, dim) for x, w in zip(got.split(widths, dim=2), widths)]


def _to_tokens(parts: list[torch.Tensor], sg: SequenceGroup) -> list[torch.Tensor]:
    """[T, w_i, D] each -> [T/d, d * w_i, D] each: the inverse of _to_heads, in one all-to-all."""
    d = sg.degree
    t, dim = parts[0].shape[0], parts[0].shape[-1]
    widths = [p.shape[1] for p in parts]
    chunks = torch.cat([p.reshape(d, t // d, w, dim) for p, w in zip(parts, widths)], dim=2)  # [d, T/d, sum w, D]
    got = _a2a(chunks, sg.group).transpose(0, 1)  # [T/d, d, sum w, D]: chunk j holds rank j's heads
    return [x.reshape(t // d, d * w, dim) for x, w in zip(got.split(widths, dim=2), widths)]


class _ToHeads(torch.autograd.Function):
    """q, k, v to every token of this rank's heads; backward: their gradients back, in one all-to-all each way
    (one collective, so every rank's backward meets the others' in the same order)."""

    @staticmethod
    def forward(ctx: Any, sg: SequenceGroup, *parts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.sg = sg
        return tuple(_to_heads(list(parts), sg))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        return (None, *_to_tokens(list(grads), ctx.sg))  # a permutation's adjoint is its inverse


class _ToTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, sg: SequenceGroup, x: torch.Tensor) -> torch.Tensor:
        ctx.sg = sg
        return _to_tokens([x], sg)[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, _to_heads([grad], ctx.sg)[0]


def spread_kv(k: torch.Tensor, degree: int) -> torch.Tensor:
    """Key/value heads [T, Hkv, D] repeated to the degree where there are fewer of them (each query head keeps
    its own key/value head: the degree is a multiple of Hkv, rlgen.mesh.head_problem)."""
    hkv = k.shape[1]
    return k if hkv >= degree else k.repeat_interleave(degree // hkv, dim=1)


def sharded_attention(kernel: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor,
                      longest: int, scale: float, sg: SequenceGroup) -> torch.Tensor:
    """A varlen kernel over a packed row split over the group: q [T/d, H, D], k and v [T/d, Hkv, D] (this rank's
    tokens) -> [T/d, H, D]; cu and longest describe the whole row."""
    if q.shape[1] % sg.degree:
        raise ValueError(f"{q.shape[1]} query heads do not split over a sequence group of {sg.degree} "
                         "(rlgen.mesh.head_problem)")
    qh, kh, vh = _ToHeads.apply(sg, q, spread_kv(k, sg.degree), spread_kv(v, sg.degree))  # [T, H/d | Hkv/d, D]
    out = kernel(qh.contiguous(), kh.contiguous(), vh.contiguous(), cu, longest, scale)  # [T, H/d, D]
    return _ToTokens.apply(sg, out)


class _SumOverGroup(torch.autograd.Function):
    """Forward: the sum over the group (each rank gives its own entries, zeros elsewhere). Backward: the
    gradient as it is, since every rank computes the same loss from the sum, and each rank's own entries take
    their gradient on that rank alone."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sg: SequenceGroup) -> torch.Tensor:
        import torch.distributed as dist

        out = x.clone()
        dist.all_reduce(out, group=sg.group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def sum_over_group(x: torch.Tensor, sg: SequenceGroup) -> torch.Tensor:
    return _SumOverGroup.apply(x, sg)


__all__ = ["SequenceGroup", "join_sequence_groups", "learner_mesh", "sharded_attention", "spread_kv", "sum_over_group"]
