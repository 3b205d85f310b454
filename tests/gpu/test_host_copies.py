"""Host copies of GPU tensors for a background checkpoint: page-locked, queued at once, equal to the tensors as
they were when copied (training that goes on after to_host returns does not reach them), tied tensors kept
tied."""

from __future__ import annotations

import pytest
import torch

from rlgen.learners.background import HostCopies, to_host

pytestmark = pytest.mark.gpu


def test_gpu_state_is_copied_into_pinned_memory_before_training_goes_on():
    w = torch.randn(1024, 1024, device="cuda")
    moments = [torch.randn(4096, 256, device="cuda") for _ in range(3)]
    view = w[:, 512:]  # a non-contiguous view (DeepSpeed's params are views into flat buffers)
    state = {"w": w, "tied": w, "m": moments, "view": view, "step": 7}
    want = {"w": w.cpu(), "m": [m.cpu() for m in moments], "view": view.cpu()}
    copy = to_host(state)
    w.mul_(0)  # the next step changes every tensor on the GPU
    for m in moments:
        m.add_(1)
    assert copy["w"].is_pinned() and copy["tied"] is copy["w"] and copy["step"] == 7
    assert torch.equal(copy["w"], want["w"]) and torch.equal(copy["view"], want["view"])
    assert all(torch.equal(a, b) for a, b in zip(copy["m"], want["m"]))


def test_copies_taken_one_at_a_time_are_read_after_one_wait():
    copies = HostCopies()
    src = [torch.full((2048, 2048), float(i), device="cuda") for i in range(4)]
    out = [copies.add(t) for t in src]
    copies.wait()
    assert all(o.is_pinned() and torch.equal(o, torch.full((2048, 2048), float(i))) for i, o in enumerate(out))
    copies.room = 0  # no room left: the next copy is an ordinary pageable one
    assert not copies.add(src[0]).is_pinned()


def test_reserved_blocks_are_taken_by_the_next_copies():
    from rlgen.learners.background import reserve_pinned, tensor_sizes

    state = {"m": [torch.randn(8192, 8192 + k, device="cuda") for k in range(3)]}  # sizes no earlier test used
    reserve_pinned(tensor_sizes(state)).join(120)
    grown = torch.cuda.host_memory_stats()["num_host_alloc"]
    copy = to_host(state)
    assert all(c.is_pinned() and torch.equal(c, m.cpu()) for c, m in zip(copy["m"], state["m"]))
    assert torch.cuda.host_memory_stats()["num_host_alloc"] == grown  # every copy took a reserved block
