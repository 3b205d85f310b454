"""rlgen's learners as weight senders: ``PolicySender`` is ``rlgen.sync.sender.WeightSender`` (pack and send to the
engines) told which weights the policy is. With LoRA the engines take the base model under its own names with the
adapters merged in (``rlgen.learners.lora``), one tensor at a time; without, the model's parameters as they are."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rlgen.sync.layout import DEFAULT_BUCKET_BYTES
from rlgen.sync.sender import WeightSender

if TYPE_CHECKING:
    import torch


class PolicySender(WeightSender):
    """The mixin a learner actor takes to feed engines over NCCL or CUDA IPC (``rlgen.sync.transports``). The
    learner provides what WeightSender asks, and ``peft``: its PEFT model with LoRA, else None or absent."""

    def named_weights(self) -> list[tuple[str, torch.nn.Parameter]]:
        """With LoRA (a ``peft`` model): the base's parameters under the base's names (iter_weights merges the
        adapters in, one tensor at a time)."""
        peft = getattr(self, "peft", None)
        if peft is not None:
            from rlgen.learners.lora import base_parameters

            return base_parameters(peft)
        return super().named_weights()

    def iter_weights(self, dtype: str | None = None,
                     bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor [full shape]) in named_weights() order, cast to dtype; with LoRA, merged."""
        peft = getattr(self, "peft", None)
        if peft is None:
            yield from super().iter_weights(dtype, bucket_bytes)
            return
        import torch

        from rlgen.learners.lora import merged_weights

        yield from merged_weights(peft, getattr(torch, dtype) if dtype else None)


__all__ = ["PolicySender"]
