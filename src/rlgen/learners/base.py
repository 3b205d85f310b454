"""The learner protocol. A learner trains on already-generated batches and hands weights to the engines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from rlgen.learners.token_batch import TokenBatch
    from rlgen.types import RolloutBatch, StepResult


@runtime_checkable
class Learner(Protocol):
    def train_step(self, batch: TokenBatch | RolloutBatch) -> StepResult:
        """One optimizer step on the batch. Returns a StepResult: the version after the step, the skip reason
        (None: applied), the step's spans [(phase, start, end), ...], with several ranks the RNG digest, and the
        metrics, plain floats/ints: loss, pg_loss, grad_norm, entropy, clip_frac, tis_frac, seq_masked_frac,
        ratio_mean, ratio_max, mismatch/* (trainer vs engine logprobs before the update; mismatch/by_length/* by
        response length), response_tokens, response_len_max (the longest response trained), and kl (when a
        reference model is used)."""

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The full model state for the engines: CPU tensors, names as in the HF checkpoint, all finite."""

    def get_version(self) -> int:
        """The policy version: the number of applied (not skipped) updates."""

    def health(self) -> dict[str, Any]:
        """{"ok": bool, "version": int, ...}; cheap, answers within a second."""

    def save(self, path: str) -> None:
        """Write the model as an HF checkpoint folder, plus the learner's own state."""

    def save_model(self, path: str) -> dict[str, Any]:
        """Called on every rank: the policy alone as an HF folder at ``path`` (rank 0 writes it), no optimizer
        state; what a run keeps at its end where the disk has no room for a whole checkpoint."""

    def save_checkpoint(self, path: str) -> dict[str, Any]:
        """Called on every rank: write the policy as an HF folder into ``path/model`` (rank 0) and this rank's
        optimizer state, counters and RNG states into ``path/learner``. A learner built with
        ``model_path=path/model, resume_from=path`` continues exactly from here."""


__all__ = ["Learner"]
