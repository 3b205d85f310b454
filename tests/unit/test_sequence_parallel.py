"""Sequence parallelism (rlgen.learners.ulysses) gives the unsharded step exactly: 2 and 4 gloo ranks, each
forwarding a slice of every packed micro-batch's tokens, against one rank, in the loss and in every parameter's
gradient (summed over the ranks), for every algorithm preset and loss option of test_packed_learner's cases and
for distillation's full estimator (a teacher forwarding each slice beside the policy).
The batches hold rows that cross the slices' boundaries, 1-token rows, rows whose loss mask is empty and episode
masks with holes; the tiny model's 2 key/value heads are split over 2 ranks and repeated over 4."""

from __future__ import annotations

import copy
import multiprocessing
import socket
from pathlib import Path

import pytest
import torch
from test_packed_learner import CASES, accumulate, algo_of, models, near_trainer, random_batch

from helpers import tokens_for
from rlgen.mesh import LearnerMesh

HOLES = (False, True)
SP_CASES = [*CASES, ("distill", {"teacher": "tiny", "distill_estimator": "full", "distill_coef": 0.5})]


def _case(preset: str, values: dict, holes: bool):
    padded, model = models()
    batch = near_trainer(padded, random_batch(1, holes), 2)
    one_micro = values.get("entropy_top_frac", 1.0) < 1
    algo = algo_of(preset, **values, micro_batch_tokens=0 if one_micro else tokens_for(batch, 3))
    ref = copy.deepcopy(model).eval() if algo.kl_coef > 0 else None
    teacher = models(9)[1].eval() if algo.distill_estimator == "full" else None
    return model, ref, batch, algo, teacher


def _step(model, ref, batch, algo, teacher=None, sequence=None) -> tuple[float, dict[str, torch.Tensor], int]:
    """One step's (loss, gradients summed over the group and divided by the batch's denominator, the packed
    row's padding) as the learners take it (rlgen.learners.step_core)."""
    step, sums = accumulate(model, ref, batch, algo, sequence, teacher)
    denom = sums.get("denom")
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).clone() for n, p in model.named_parameters()}
    if sequence is not None:
        import torch.distributed as dist

        for g in grads.values():
            dist.all_reduce(g)
    padding = sum(p.padding for p in step.packs)
    return sums.losses(1.0 / denom, algo)[2], {n: g / denom for n, g in grads.items()}, padding


def _rank(rank: int, degree: int, port: int, out: str) -> None:
    """One rank of a sequence group of degree: every case's step, saved to out/rank{rank}.pt."""
    import torch.distributed as dist

    from rlgen.learners.collective import join_group
    from rlgen.learners.ulysses import join_sequence_groups

    torch.set_num_threads(1)
    join_group(rank, degree, "127.0.0.1", port, 120.0, torch.device("cpu"))
    group = join_sequence_groups(LearnerMesh(1, degree).sequence_groups(), rank, 120.0)
    results = {}
    for i, (preset, values) in enumerate(SP_CASES):
        for holes in HOLES:
            results[(i, holes)] = _step(*_case(preset, values, holes), sequence=group)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> dict[int, list[dict]]:
    """Each degree's results, rank by rank."""
    ctx = multiprocessing.get_context("spawn")
    got = {}
    for degree in (2, 4):
        out = tmp_path_factory.mktemp(f"sp{degree}")
        port = _free_port()
        procs = [ctx.Process(target=_rank, args=(r, degree, port, str(out))) for r in range(degree)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
        for p in procs:
            if p.is_alive():
                p.kill()
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        got[degree] = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(degree)]
    return got


@pytest.mark.parametrize("holes", HOLES, ids=["turns", "episodes"])
@pytest.mark.parametrize("index", range(len(SP_CASES)),
                         ids=[f"{p}-{'-'.join(v) or 'preset'}" for p, v in SP_CASES])
def test_sequence_parallel_equals_one_rank(sharded, index, holes):
    preset, values = SP_CASES[index]
    want_loss, want_grads, _ = _step(*_case(preset, values, holes))
    assert any(float(g.abs().sum()) > 0 for g in want_grads.values())
    for degree, ranks in sharded.items():
        paddings = set()
        for rank, results in enumerate(ranks):
            loss, grads, padding = results[(index, holes)]
            paddings.add(padding)
            assert loss == pytest.approx(want_loss, rel=1e-5, abs=1e-6), (degree, rank)
            for name, g in want_grads.items():
                torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=f"{name} degree {degree}")
        assert len(paddings) == 1  # every rank packed the same row


def test_the_mesh_numbers_ranks_data_major():
    mesh = LearnerMesh(data=2, sequence=3)
    assert mesh.ranks == 6
    assert [mesh.data_rank(r) for r in range(6)] == [0, 0, 0, 1, 1, 1]
    assert [mesh.sequence_rank(r) for r in range(6)] == [0, 1, 2, 0, 1, 2]
    assert mesh.sequence_groups() == [(0, 1, 2), (3, 4, 5)]
    assert mesh.sequence_group(4) == (3, 4, 5)
    assert mesh.leaders() == [0, 3] and [r for r in range(6) if mesh.leads(r)] == [0, 3]
    assert mesh.sends_weights(0) and not mesh.sends_weights(3)
    assert mesh.describe() == "data 2 x sequence 3 (6 ranks)"
    with pytest.raises(ValueError, match="at least 1"):
        LearnerMesh(data=0)
