"""A tiled MLP (rlgen.learners.tiling) and offloaded checkpoints (rlgen.learners.offload) give the plain step exactly: the loss and every parameter's gradient of a
packed micro-batch, for every algorithm preset, with tiles far shorter than the packed row; its no-grad forward
is the same too, and a copy of a tiled model (a frozen reference) tiles its own weights."""

from __future__ import annotations

import copy

import pytest
import torch
from test_packed_learner import PRESETS, algo_of, models, near_trainer, packed_step, random_batch

from rlgen.learners.packed import pack, packed_forward
from rlgen.learners.tiling import tile_mlps

TILE = 7  # tokens: a packed row of this batch is about 100


@pytest.mark.parametrize("preset", PRESETS)
def test_a_tiled_mlp_trains_what_the_untiled_one_trains(preset):
    padded, plain = models()
    tiled = copy.deepcopy(plain)
    assert tile_mlps(tiled, TILE) == 2 and tile_mlps(tiled, TILE) == 0  # two layers, tiled once
    batch = near_trainer(padded, random_batch(1), 2)
    algo = algo_of(preset, micro_batch_tokens=0)
    want_loss, want_norm = packed_step(plain, None, batch, algo)
    got_loss, got_norm = packed_step(tiled, None, batch, algo)
    assert got_loss == pytest.approx(want_loss, rel=1e-5, abs=1e-6)
    assert got_norm == pytest.approx(want_norm, rel=1e-5) and want_norm > 0
    mine = dict(tiled.named_parameters())
    assert mine.keys() == dict(plain.named_parameters()).keys()  # the parameter names stay as they were
    for name, p in plain.named_parameters():
        torch.testing.assert_close(mine[name].grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_tiled_forward_without_gradients_and_a_copy_of_it():
    _, plain = models(3)
    tiled = copy.deepcopy(plain)
    tile_mlps(tiled, TILE)
    batch = random_batch(4)
    one = pack(batch.input_ids, batch.attention_mask, batch.response_mask.bool(), batch.prompt_len)
    assert one.tokens > 4 * TILE
    with torch.no_grad():
        want, _ = packed_forward(plain, one, 1.0)
        got, _ = packed_forward(tiled, one, 1.0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        twin = copy.deepcopy(tiled)  # as frozen_reference copies a policy
        for p in twin.parameters():
            p.mul_(0.5)
        assert not torch.allclose(packed_forward(twin, one, 1.0)[0], want)  # the copy runs its own weights
        torch.testing.assert_close(packed_forward(tiled, one, 1.0)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("preset", ["grpo", "cispo"])
def test_offloaded_checkpoints_train_what_kept_ones_train(preset):
    from rlgen.learners.offload import offload_checkpoints

    padded, kept = models()
    kept.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    offloaded = copy.deepcopy(kept)
    assert offload_checkpoints(offloaded) == 2  # the two decoder layers
    batch = near_trainer(padded, random_batch(1), 2)
    algo = algo_of(preset, micro_batch_tokens=0)
    want_loss, _ = packed_step(kept, None, batch, algo)
    got_loss, _ = packed_step(offloaded, None, batch, algo)
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    mine = dict(offloaded.named_parameters())
    for name, p in kept.named_parameters():
        torch.testing.assert_close(mine[name].grad, p.grad, rtol=1e-6, atol=1e-8, msg=name)
    _, plain = models()
    with pytest.raises(ValueError, match="gradient checkpointing on"):
        offload_checkpoints(plain)
