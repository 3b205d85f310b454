"""What every learner does with a batch, whatever takes and applies its gradients: this rank's token batch
(rlgen.learners.token_batch) on its device, each micro-batch's loss by the algorithm registered in rlgen.algo
(plus the KL to the reference and the entropy bonus), its backward, and the step's metrics and spans.

A learner holds one `StepCore` and hands it the model to forward and the backward to call: the torch learner's
is the loss's own backward (the gradients divided by the whole batch's denominator afterwards), the DeepSpeed
learner's is its engine's (the loss divided before).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rlgen.algo.registry import Algorithm
from rlgen.algo.registry import algorithm as find_algorithm
from rlgen.config import AlgoConfig, DistillEstimator, KLPenalty, LossAgg, MonitorConfig
from rlgen.learners.grpo_step import (
    MicroLoss,
    StepSums,
    batch_denominator,
    inverse,
    micro_loss,
    sequence_kl,
    step_result,
    with_old_logprobs,
)
from rlgen.learners.teacher import TeacherScores, teacher_logprobs
from rlgen.learners.token_batch import Micro, TokenBatch, token_batch
from rlgen.learners.ulysses import SequenceGroup
from rlgen.types import RolloutBatch, StepResult


class StepCore:
    """Batch -> loss -> backward -> metrics for one learner rank, with the algorithm's loss (algorithm, or
    algo.kind's when None) aggregated by algo.loss_agg. ref_model: the frozen KL reference, set by the learner
    when algo.kl_coef > 0 (None: no KL anywhere)."""

    def __init__(self, algo: AlgoConfig, monitor: MonitorConfig, device: torch.device,
                 algorithm: Algorithm | None = None) -> None:
        self.algo, self.monitor, self.device = algo, monitor, device
        self.loss_agg = LossAgg(algo.loss_agg)
        self.loss_fn = (algorithm or find_algorithm(algo.kind)).loss
        self.ref_model: nn.Module | None = None
        self.teacher: nn.Module | None = None  # on-policy distillation's frozen teacher, set by the learner
        # sequence parallelism: this rank's group, set by the learner once it has joined it (None: one rank)
        self.sequence: SequenceGroup | None = None

    def kl_in_loss(self) -> bool:
        """Whether the KL to the reference goes into the loss (algo.kl_penalty=loss, with a reference)."""
        return self.ref_model is not None and KLPenalty(self.algo.kl_penalty) is KLPenalty.loss

    def batch(self, batch: TokenBatch | RolloutBatch) -> TokenBatch:
        """The token batch on this rank's device, for its sequence group: as the driver built it, or a padded
        RolloutBatch built into one here, in micro-batches of at most algo.micro_batch_tokens tokens."""
        if isinstance(batch, RolloutBatch):
            degree = self.sequence.degree if self.sequence is not None else 1
            batch = token_batch(batch, batch.micro_rows, self.algo.micro_batch_tokens, degree)
        return batch.on(self.device, self.sequence)

    def prepare(self, model: nn.Module, batch: TokenBatch | RolloutBatch) -> TokenBatch:
        """The batch on this rank's device (`batch`), with the trainer's own logprobs before the update where
        algo.old_logprobs=trainer (one no-grad forward of model per micro-batch)."""
        return with_old_logprobs(model, self.batch(batch), self.algo)

    def denominator(self, model: nn.Module, step: TokenBatch) -> float:
        """This shard's share of the loss denominator, before any backward (a no-grad forward per micro-batch
        under sequence masking)."""
        return batch_denominator(model, step, self.algo, self.loss_agg)

    def micro_loss(self, model: nn.Module, micro: Micro) -> MicroLoss:
        """One micro-batch's loss, undivided (denominator 1), with the KL when it goes in the loss, and the
        teacher's whole reverse KL under algo.distill_estimator=full."""
        ref = self.ref_model if self.kl_in_loss() else None
        full = DistillEstimator(self.algo.distill_estimator) is DistillEstimator.full
        return micro_loss(model, ref, micro, self.algo, self.loss_agg, self.loss_fn,
                          teacher=self.teacher if full else None)

    def accumulate(self, model: nn.Module, step: TokenBatch, backward: Callable[[torch.Tensor], Any], *,
                   scale: float | None = None, boundary: Callable[[bool], Any] | None = None,
                   poison: bool = False) -> StepSums:
        """Forward, loss and backward of each micro-batch, in order; returns their results gathered.

        backward(loss) takes one micro-batch's gradients. The loss is summed over its tokens/sequences (scale
        None: the learner divides the gradients by the whole batch's denominator once all are done), or times
        scale (the gradient accumulation scale: 1 / denominator, times the ranks an engine averages over).
        boundary(last), when given, hears before each forward whether it is the step's last micro-batch. poison:
        a non-finite loss (this micro-batch's, or the batch's so far at the last one) goes to backward as NaN,
        so that an engine's overflow check skips the step. Parameters do not change in here, so the trainer
        logprobs gathered are those before the update."""
        sums = StepSums(step)
        micros = step.micros()
        for i, micro in enumerate(micros):
            last = i == len(micros) - 1
            if boundary is not None:
                boundary(last)
            bad = poison and last and not math.isfinite(sums.losses(scale or 0.0, self.algo)[2])
            out = self.micro_loss(model, micro)
            total = out.total
            if poison and (bad or not math.isfinite(out.pg + out.kl + out.ent + out.distill)):
                total = total * float("nan")
            backward(total if scale is None else total * scale)
            sums.add(micro.rows, out.logp.detach(), out.sums(), out.metrics)
        return sums

    def losses(self, sums: StepSums, denom: float) -> tuple[float, float, float]:
        """(pg_loss, kl, loss) of the batch over the denominator denom (0: no loss tokens, all 0.0)."""
        return sums.losses(inverse(denom), self.algo)

    def result(self, step: TokenBatch, sums: StepSums, losses: tuple[float, float, float], *, grad_norm: float,
               version: int, reason: str | None, start: float, overflow: bool = False) -> StepResult:
        """What train_step returns (`Learner.train_step`): the policy version after the step, the skip reason
        (None: applied; overflow: an fp16 loss scale's skip), the train span from start to now, and the metrics
        with the losses from `losses`."""
        pg_loss, kl_value, loss = losses
        return step_result(step, sums, loss=loss, pg_loss=pg_loss,
                           kl_value=kl_value if self.kl_in_loss() else None, grad_norm=grad_norm,
                           version=version, reason=reason, delta_threshold=self.monitor.delta_threshold,
                           start=start, overflow=overflow)

    def sequence_kl(self, batch: TokenBatch | RolloutBatch) -> list[float]:
        """Each sequence's summed KL between the engine's policy and the reference (algo.kl_penalty=reward: the
        driver subtracts kl_coef times it from the rewards before the advantages). [] without a reference."""
        if self.ref_model is None:
            return []
        return [float(v) for v in sequence_kl(self.ref_model, self.batch(batch), self.algo).cpu()]

    def teacher_scores(self, batch: TokenBatch | RolloutBatch) -> TeacherScores:
        """The teacher's logprobs of the batch's response tokens (algo.teacher: the driver makes each token's
        distillation advantage of them). Raises RuntimeError on a learner started without a teacher."""
        if self.teacher is None:
            raise RuntimeError("this learner holds no teacher: it was started without algo.teacher")
        return teacher_logprobs(self.teacher, self.batch(batch), self.algo)


__all__ = ["StepCore"]
