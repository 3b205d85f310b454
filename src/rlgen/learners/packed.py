"""A micro-batch as tokens, not a rectangle: its rows' real tokens back to back in one row, position ids that
restart at each row, attention that never crosses rows (rlgen.learners.attention), and the logprob and entropy of
each response token computed from the model's last hidden states a chunk of tokens at a time, so no tensor of
every position times the vocabulary in fp32 ever exists.

A row is forwarded up to its last response token under the response mask: tokens after it change no logprob
the loss reads (attention is causal). The results come back in the padded layout the losses take, [n, Lm]
(Lm: the micro-batch's longest kept response), zeros off the kept tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlgen.algo.loss import token_entropy, token_logprobs
from rlgen.learners.ulysses import SequenceGroup, sum_over_group
from rlgen.metrics.mismatch import response_lengths
from rlgen.microbatches import chunk_tokens


@dataclass(frozen=True)
class Packed:
    """One micro-batch's rows packed into one row of T tokens, R of whose positions predict a response token."""

    ids: torch.Tensor  # [1, T] each row's prompt then its kept response, less its last token
    positions: torch.Tensor  # [1, T] 0, 1, ... restarting at each row
    cu_seqlens: torch.Tensor  # [k+1] int32: where each forwarded row starts and ends
    longest: int  # the longest forwarded row
    predict: torch.Tensor  # [R] positions whose hidden state predicts a response token
    targets: torch.Tensor  # [R] the response tokens they predict
    slot: torch.Tensor  # [R] where each goes in the [n, Lm] padded layout, flattened (row * Lm + column)
    rows: int  # n
    resp_len: int  # Lm
    # sequence parallelism: this rank's group, each rank forwarding its slice of the row (rlgen.learners.ulysses);
    # padding: tokens after the rows, one segment that predicts nothing, making the row a multiple of the degree
    sequence: SequenceGroup | None = None
    padding: int = 0

    @property
    def tokens(self) -> int:
        """The rows' tokens (the padding left out)."""
        return int(self.ids.shape[1]) - self.padding

    def on(self, device: torch.device, sequence: SequenceGroup | None = None) -> Packed:
        """The micro-batch on device, forwarded by sequence's ranks (None: by one rank, whole)."""
        moved = {k: getattr(self, k).to(device, non_blocking=True)
                 for k in ("ids", "positions", "cu_seqlens", "predict", "targets", "slot")}
        return dataclasses.replace(self, **moved, sequence=sequence)

    def local(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, positions) [1, T'] this rank forwards: the whole row, or its slice under sequence parallelism."""
        if self.sequence is None:
            return self.ids, self.positions
        lo, hi = self.sequence.bounds(int(self.ids.shape[1]))
        return self.ids[:, lo:hi], self.positions[:, lo:hi]


def kept_lengths(attn: torch.Tensor, mask: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt tokens [N], kept response tokens [N]) of padded rows: attn [N, P+L] (prompts left-padded,
    responses right-padded), mask [N, L]. A response is kept up to its last token under the mask; a row with no
    such token keeps one response token (so every micro-batch has a token to differentiate)."""
    prompt = attn[:, :prompt_len].sum(dim=-1)  # [N]
    resp = attn[:, prompt_len:].sum(dim=-1)  # [N]
    last = response_lengths(mask).to(prompt.device)  # [N]
    return prompt, torch.where(last > 0, last, resp.clamp(max=1))


def row_tokens(attn: torch.Tensor, mask: torch.Tensor, prompt_len: int) -> list[int]:
    """The tokens each padded row puts into a packed forward (what a micro-batch's budget counts)."""
    prompt, kept = kept_lengths(attn, mask, prompt_len)
    return torch.where(kept > 0, prompt + kept - 1, prompt).tolist()  # pack() forwards a bare prompt whole


def _cat(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=device)


def pack(ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor, prompt_len: int, degree: int = 1) -> Packed:
    """Padded rows ids, attn [n, P+L] and mask [n, L] as one packed row, padded at its end to a multiple of the
    sequence degree (each rank of a group forwards an equal slice; `Packed.on` hands it the group)."""
    prompt, kept = kept_lengths(attn, mask, prompt_len)
    pieces, positions, bounds, predict, targets, slot = [], [], [0], [], [], []
    resp_len = max(int(kept.max().item()), 1) if len(kept) else 1
    start = 0
    for j, (p, k) in enumerate(zip(prompt.tolist(), kept.tolist())):
        whole = ids[j, prompt_len - p: prompt_len + k]  # [p + k]
        fwd = whole[:-1] if k > 0 else whole  # the last token predicts nothing the loss reads
        if fwd.numel() == 0:
            continue
        pieces.append(fwd)
        positions.append(torch.arange(fwd.numel(), device=ids.device))
        if k > 0:
            predict.append(torch.arange(start + p - 1, start + p - 1 + k, device=ids.device))
            targets.append(whole[p:])
            slot.append(j * resp_len + torch.arange(k, device=ids.device))
        start += fwd.numel()
        bounds.append(start)
    padding = (-start) % max(degree, 1)
    if padding:  # a segment of its own: it attends only to itself, and no position of it predicts a token
        pieces.append(torch.zeros(padding, dtype=ids.dtype, device=ids.device))
        positions.append(torch.arange(padding, device=ids.device))
        bounds.append(start + padding)
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    return Packed(
        ids=_cat(pieces, ids.device).unsqueeze(0),
        positions=_cat(positions, ids.device).unsqueeze(0),
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32, device=ids.device),
        longest=max(lengths, default=0),
        predict=_cat(predict, ids.device),
        targets=_cat(targets, ids.device),
        slot=_cat(slot, ids.device),
        rows=int(ids.shape[0]),
        resp_len=resp_len,
        padding=padding,
    )


def causal_lm(model: nn.Module) -> nn.Module:
    """The transformers causal LM inside a learner's model: through a PEFT model (get_base_model), the LoRA
    reference (AdapterOff.wrapped) or a DeepSpeed engine (.module)."""
    from transformers import PreTrainedModel

    for _ in range(8):
        if isinstance(model, PreTrainedModel):
            return model
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif isinstance(getattr(model, "wrapped", None), nn.Module):
            model = model.wrapped
        elif isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        elif hasattr(model, "get_output_embeddings"):
            return model
        else:
            break
    raise TypeError(f"{type(model).__name__} holds no transformers causal LM")


def _stats(hidden: torch.Tensor, head: nn.Module, targets: torch.Tensor, temperature: float,
           entropy_grad: bool, teacher_hidden: torch.Tensor | None = None,
           teacher_head: nn.Module | None = None) -> torch.Tensor:
    """hidden [c, H] -> [c, 2]: (logprob of each target, entropy of its distribution) in fp32, of the logits
    divided by temperature (> 0 and not 1), as the engine reports the logprobs of what it sampled from. With a
    teacher's last hidden states at the same positions (teacher_hidden [c, H_t], through teacher_head, without
    gradient) -> [c, 3]: and each position's whole reverse KL, KL(pi_student || pi_teacher), over the vocabulary."""
    logits = _scaled(head(hidden), temperature)  # [1, c, V]
    logp = token_logprobs(logits, targets.unsqueeze(0))[0]  # [c]
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = token_entropy(logits)[0]  # [c]
    if teacher_hidden is None:
        return torch.stack([logp, entropy], dim=-1)
    with torch.no_grad():
        teacher_logp = torch.log_softmax(_scaled(teacher_head(teacher_hidden), temperature)[0], dim=-1)  # [c, V]
    own = torch.log_softmax(logits[0], dim=-1)  # [c, V]
    kl = (own.exp() * (own - teacher_logp)).sum(dim=-1)  # [c]
    return torch.stack([logp, entropy, kl], dim=-1)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[c, V] -> [1, c, V] fp32 logits, divided by temperature (> 0 and not 1)."""
    logits = logits.float().unsqueeze(0)
    return logits / temperature if temperature > 0 and temperature != 1.0 else logits


class _StatsHead(nn.Module):
    """Stands in for the LM head during one packed forward: the last hidden states [1, T, H] -> [1, R, 2], the
    response tokens' (logprob, entropy), a chunk of tokens at a time; with gradients on, each chunk's logits are
    recomputed in backward rather than kept."""

    def __init__(self, head: nn.Module, packed: Packed, temperature: float, entropy_grad: bool, chunk: int,
                 teacher: tuple[torch.Tensor, nn.Module] | None = None):
        super().__init__()
        self._head = (head,)  # not registered: the model's parameter names stay what they are
        self.packed, self.temperature, self.entropy_grad, self.chunk = packed, temperature, entropy_grad, chunk
        self._teacher = teacher  # (the teacher's last hidden states [1, T, H_t], its LM head): a third stat

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        head, p = self._head[0], self.packed
        own, first = None, 0
        if p.sequence is not None:  # hidden holds this rank's slice of the row: the positions inside it
            first, end = p.sequence.bounds(int(p.ids.shape[1]))
            own = ((p.predict >= first) & (p.predict < end)).nonzero().squeeze(-1)  # [R'] indices into R
        predict, targets = (p.predict, p.targets) if own is None else (p.predict[own], p.targets[own])
        h = hidden[0].index_select(0, predict - first)  # [R', H]
        ht = None if self._teacher is None else self._teacher[0][0].index_select(0, predict - first)  # [R', H_t]
        parts = []
        for lo in range(0, max(h.shape[0], 1), self.chunk):
            args = (h[lo: lo + self.chunk], head, targets[lo: lo + self.chunk], self.temperature, self.entropy_grad)
            if ht is not None:
                args += (ht[lo: lo + self.chunk], self._teacher[1])
            parts.append(checkpoint(_stats, *args, use_reentrant=False) if torch.is_grad_enabled() else _stats(*args))
        stats = torch.cat(parts)  # [R', k]: k = 2, or 3 with the teacher's KL
        if own is not None:  # every rank's tokens, on every rank (rlgen.learners.ulysses.sum_over_group)
            whole = stats.new_zeros(p.predict.shape[0], stats.shape[1]).index_copy(0, own, stats)  # [R, k]
            stats = sum_over_group(whole, p.sequence)
        return stats.unsqueeze(0)  # [1, R, k]


def packed_forward(model: nn.Module, packed: Packed, temperature: float, entropy_grad: bool = False,
                   chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs [n, Lm], entropies [n, Lm]) of a packed micro-batch's response tokens, zeros elsewhere; the
    logprobs carry gradients (when enabled), the entropies only with entropy_grad. chunk: response tokens per
    chunk of the LM head (default: rlgen.microbatches.CHUNK_LOGIT_BYTES of fp32 logits)."""
    grid = _forward(model, packed, temperature, entropy_grad, chunk, None)
    return grid[..., 0], grid[..., 1]


def packed_forward_taught(model: nn.Module, teacher: nn.Module, packed: Packed, temperature: float,
                          entropy_grad: bool = False, chunk: int | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """packed_forward, and each response token's whole reverse KL to a frozen teacher over the vocabulary,
    KL(pi_student || pi_teacher) at its position [n, Lm], with the student's gradient: the teacher forwards the
    same packed rows without gradient, and both heads run a chunk of tokens at a time."""
    lm = causal_lm(teacher)
    head = lm.get_output_embeddings()
    lm.set_output_embeddings(nn.Identity())  # the teacher's last hidden states, not its [T, V] logits
    ids, positions = packed.local()
    try:
        with torch.no_grad():
            hidden = teacher(input_ids=ids, position_ids=positions, use_cache=False,
                             packed_segments=(packed.cu_seqlens, packed.longest, packed.sequence)).logits  # [1, T, H_t]
    finally:
        lm.set_output_embeddings(head)
    grid = _forward(model, packed, temperature, entropy_grad, chunk, (hidden, head))
    return grid[..., 0], grid[..., 1], grid[..., 2]


def _forward(model: nn.Module, packed: Packed, temperature: float, entropy_grad: bool, chunk: int | None,
             teacher: tuple[torch.Tensor, nn.Module] | None) -> torch.Tensor:
    """The response tokens' stats (_stats) in the padded layout, [n, Lm, k]."""
    lm = causal_lm(model)
    head = lm.get_output_embeddings()
    size = chunk or chunk_tokens(int(lm.config.vocab_size))
    lm.set_output_embeddings(_StatsHead(head, packed, temperature, entropy_grad, size, teacher))
    ids, positions = packed.local()
    try:
        out = model(input_ids=ids, position_ids=positions, use_cache=False,
                    packed_segments=(packed.cu_seqlens, packed.longest, packed.sequence))
    finally:
        lm.set_output_embeddings(head)
    stats = out.logits[0]  # [R, k]
    n, cols, k = packed.rows, packed.resp_len, stats.shape[-1]
    flat = torch.zeros(n * cols, k, dtype=stats.dtype, device=stats.device).index_copy(0, packed.slot, stats)
    return flat.view(n, cols, k)


__all__ = ["Packed", "causal_lm", "kept_lengths", "pack", "packed_forward", "packed_forward_taught",
           "row_tokens"]
