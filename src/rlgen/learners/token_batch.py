"""A learner rank's share of a step as it trains it: one token-level batch, built once by the driver
(runtime.step.shards) and trained as sent. Its rows are packed into micro-batches (rlgen.learners.packed: the
tokens back to back, where each sequence starts and ends, position ids, which positions predict which response
token), padded for the sequence degree, beside each row's response mask, engine logprobs and advantage (and,
under on-policy distillation, each token's added term) in the [rows, longest kept response] layout the losses
read. No [rows, prompt + response] rectangle reaches a learner.

The learner moves it to its device and hands each packed micro-batch its sequence group (`TokenBatch.on`). A
RolloutBatch handed to a learner directly (tests, benchmarks) is built into one by the same function
(`token_batch`), in micro-batches of algo.micro_batch_tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rlgen.learners.packed import Packed, kept_lengths, pack, row_tokens
from rlgen.learners.ulysses import SequenceGroup
from rlgen.microbatches import assign
from rlgen.types import RolloutBatch


@dataclass(frozen=True)
class Micro:
    """One micro-batch: its rows packed and their per-token tensors, cut to the micro-batch's longest kept
    response Lm."""

    rows: torch.Tensor  # [n] the shard's row indices
    packed: Packed
    mask: torch.Tensor  # [n, Lm] bool
    engine_logp: torch.Tensor  # [n, Lm] float32
    advantages: torch.Tensor  # [n] float32
    old_logp: torch.Tensor | None = None  # [n, Lm] the trainer's before the update (old_logprobs=trainer)
    token_advantages: torch.Tensor | None = None  # [n, Lm] float32 added to each token's (distillation's term)

    def loss_advantages(self) -> torch.Tensor:
        """What the policy loss reads: [n] one per sequence, or [n, Lm] with the per-token term added."""
        if self.token_advantages is None:
            return self.advantages
        return self.advantages.unsqueeze(-1) + self.token_advantages


@dataclass(frozen=True)
class TokenBatch:
    """A learner rank's rows as packed micro-batches, with their per-token tensors ([N, L]: L the longest kept
    response of the rows) and the sequence degree the packs were padded for."""

    mask: torch.Tensor  # [N, L] bool
    engine_logp: torch.Tensor  # [N, L] float32
    advantages: torch.Tensor  # [N] float32
    micro_rows: tuple[torch.Tensor, ...]  # each micro-batch's row indices [n]
    packs: tuple[Packed, ...]  # each micro-batch packed
    degree: int = 1
    old_logp: torch.Tensor | None = None  # [N, L] float32: the trainer's before the update (old_logprobs=trainer)
    # [N, L] float32: a per-token term each token's advantage adds (on-policy distillation's, 0 off the mask)
    token_advantages: torch.Tensor | None = None

    @property
    def n_rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def resp_len(self) -> int:
        return int(self.mask.shape[1])

    @property
    def device(self) -> torch.device:
        return self.mask.device

    @property
    def tokens(self) -> int:
        """The tokens the micro-batches forward (the degree's padding left out)."""
        return sum(p.tokens for p in self.packs)

    def micros(self) -> list[Micro]:
        """The micro-batches, in order."""
        out = []
        for rows, packed in zip(self.micro_rows, self.packs):
            cols = packed.resp_len
            old = None if self.old_logp is None else self.old_logp[rows, :cols]
            term = None if self.token_advantages is None else self.token_advantages[rows, :cols]
            out.append(Micro(rows, packed, self.mask[rows, :cols], self.engine_logp[rows, :cols],
                             self.advantages[rows], old, term))
        return out

    def with_advantages(self, advantages: torch.Tensor, token: torch.Tensor | None = None) -> TokenBatch:
        """The same batch with these rows' advantages [N] and, where given, a per-token term [N, L] added to
        each token's (the packs are shared, not copied)."""
        if tuple(advantages.shape) != (self.n_rows,):
            raise ValueError(f"bad batch: {tuple(advantages.shape)} advantages for {self.n_rows} rows")
        if token is not None and tuple(token.shape) != tuple(self.mask.shape):
            raise ValueError(f"bad batch: a per-token advantage of {tuple(token.shape)} for {tuple(self.mask.shape)}")
        return dataclasses.replace(self, advantages=advantages.to(torch.float32),
                                   token_advantages=None if token is None else token.to(torch.float32))

    def on(self, device: torch.device, sequence: SequenceGroup | None = None) -> TokenBatch:
        """The batch on device, each micro-batch forwarded by this rank's sequence group (None: whole rows).
        Raises ValueError where it was built for another degree, or its micro-batches do not take each row once."""
        degree = sequence.degree if sequence is not None else 1
        if degree != self.degree:
            raise ValueError(f"bad batch: packed for sequence degree {self.degree}, trained at degree {degree}")
        taken = sorted(int(r) for rows in self.micro_rows for r in rows.tolist())
        if taken != list(range(self.n_rows)) or not all(len(r) for r in self.micro_rows):
            raise ValueError(f"bad batch: its micro-batches {[r.tolist() for r in self.micro_rows]} do not take each "
                             f"of its {self.n_rows} rows once")
        moved = {f.name: _to(getattr(self, f.name), device) for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **moved, micro_rows=tuple(r.to(device) for r in self.micro_rows),
                                   packs=tuple(p.on(device, sequence) for p in self.packs))


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t.to(device, non_blocking=True)


def token_batch(batch: RolloutBatch, micro_rows: list[list[int]] | None = None, micro_batch_tokens: int = 0,
                degree: int = 1) -> TokenBatch:
    """A rank's rows (batch: padded, as generated) as the learner trains them: in the micro-batches given (the
    driver's assignment), or else of at most micro_batch_tokens packed tokens (0: one), each packed and padded
    to a multiple of degree. Raises ValueError where the response mask does not match input_ids and
    prompt_len, or the micro-batches do not take each row once."""
    ids, attn = batch.input_ids, batch.attention_mask  # [N, P+L]
    mask = batch.response_mask > 0  # [N, L]
    n_rows, prompt_len = int(ids.shape[0]), batch.prompt_len
    resp_len = int(ids.shape[1]) - prompt_len
    if prompt_len < 1 or resp_len < 1 or tuple(mask.shape) != (n_rows, resp_len) or attn.shape != ids.shape:
        raise ValueError(f"bad batch: input_ids {tuple(ids.shape)}, attention_mask {tuple(attn.shape)}, prompt_len "
                         f"{prompt_len}, response_mask {tuple(mask.shape)}")
    groups = micro_rows if micro_rows is not None else assign(
        row_tokens(attn, mask, prompt_len), 1, micro_batch_tokens).local(0)
    if sorted(r for g in groups for r in g) != list(range(n_rows)) or not all(groups):
        raise ValueError(f"bad batch: its micro-batches {groups} do not take each of its {n_rows} rows once")
    rows = tuple(torch.tensor(g, dtype=torch.long) for g in groups)
    packs = tuple(pack(ids[r], attn[r], mask[r], prompt_len, degree=degree) for r in rows)
    cols = max(int(kept_lengths(attn, mask, prompt_len)[1].max().item()) if n_rows else 1, 1)
    return TokenBatch(mask[:, :cols].contiguous(), batch.engine_logprobs[:, :cols].to(torch.float32).contiguous(),
                      batch.advantages.to(torch.float32), rows, packs, degree)


__all__ = ["Micro", "TokenBatch", "token_batch"]
