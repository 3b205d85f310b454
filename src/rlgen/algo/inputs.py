"""What a policy loss takes and gives: `LossInputs` (one micro-batch's tensors, shapes on the fields) and
`LossOutputs` (the loss and its metrics). n = sequences of the micro-batch, L = response length."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rlgen.metrics.reduce import Reduced


@dataclass(frozen=True)
class LossInputs:
    logp: torch.Tensor  # [n, L] the trainer's logprobs of the sampled tokens, with gradient
    old_logp: torch.Tensor  # [n, L] pi_old of the ratio, no gradient: engine_logp, or the trainer's before the update
    engine_logp: torch.Tensor  # [n, L] the engine's logprobs (the behaviour policy that sampled the tokens)
    advantages: torch.Tensor  # [n] one per sequence, or [n, L] one per token (on-policy distillation)
    mask: torch.Tensor  # [n, L] bool: the response tokens
    token_weight: torch.Tensor | None = None  # [n, L] multiplies each token's term (the entropy mask); None: 1
    denominator: float | None = None  # what the aggregate divides by; None: this mask's (see loss.aggregate)
    old_from_trainer: bool = False  # old_logp is the trainer's (algo.old_logprobs=trainer)

    def trainer_before(self) -> torch.Tensor:
        """[n, L], no gradient: the trainer's logprobs that the engine/trainer IS weight compares with
        engine_logp: old_logp when it is the trainer's, else the current logp (the same before the update)."""
        return self.old_logp if self.old_from_trainer else self.logp.detach()


@dataclass
class LossOutputs:
    loss: torch.Tensor  # [] with gradient: the micro-batch's aggregated loss
    # any metrics: a plain number is a mean over the micro-batch's response tokens, a rlgen.metrics.reduce.Reduced
    # says how it reduces (clip_frac over the loss's tokens, ratio_max a maximum, ...); each reaches metrics.jsonl
    metrics: dict[str, float | Reduced] = field(default_factory=dict)


__all__ = ["LossInputs", "LossOutputs"]
