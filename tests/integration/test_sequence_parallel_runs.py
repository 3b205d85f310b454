"""A run whose learner ranks are a sequence-parallel mesh (learner.sequence_parallel, Ray on CPU, torch learners
over gloo) trains what the data-parallel run of its data ranks trains: the same rollouts, the same loss at every
step and the same final weights, with the group's metrics reported once (its peers' are not added in)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime.run import run_training


@pytest.fixture(scope="module", autouse=True)
def ray_for_four_ranks():
    """One local Ray cluster for the module's runs, of logical CPUs for four learner ranks and an engine."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=6, include_dashboard=False, object_store_memory=512 * 2**20)
    yield
    ray.shutdown()


BASE = ["progress=false", "algo.prompts_per_step=8", "checkpoint.every=0", "steps=3", "algo.async_steps=0"]


def _run(out: Path, *overrides: str):
    plan = build_plan(compose_run_config(BASE + list(overrides)))
    run_training(plan, out, Console(quiet=True))
    return plan, read_jsonl(out / "metrics.jsonl"), load_file(str(out / "final_model" / "model.safetensors"))


def _same(a: tuple, b: tuple) -> None:
    (_, steps_a, weights_a), (_, steps_b, weights_b) = a, b
    assert len(steps_a) == len(steps_b) == 3
    for x, y in zip(steps_a, steps_b):
        assert x["response_tokens"] == y["response_tokens"] and x["sequences"] == y["sequences"]
        assert x["reward_mean"] == y["reward_mean"]
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4, abs=1e-6)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)
    assert weights_a.keys() == weights_b.keys()
    for name, w in weights_a.items():
        torch.testing.assert_close(w, weights_b[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_a_sequence_group_trains_what_one_rank_trains(tmp_path):
    sharded = _run(tmp_path / "sp2", "hardware.learner_ranks=2", "learner.sequence_parallel=2")
    whole = _run(tmp_path / "one", "hardware.learner_ranks=1")
    assert (sharded[0].mesh.data, sharded[0].mesh.sequence) == (1, 2)
    assert (whole[0].mesh.data, whole[0].mesh.sequence) == (1, 1)
    _same(sharded, whole)


@pytest.mark.slow
def test_two_sequence_groups_train_what_two_data_ranks_train(tmp_path):
    mesh = _run(tmp_path / "dp2-sp2", "hardware.learner_ranks=4", "learner.sequence_parallel=2")
    data = _run(tmp_path / "dp2", "hardware.learner_ranks=2", "learner.sequence_parallel=1")
    assert (mesh[0].mesh.data, mesh[0].mesh.sequence) == (2, 2)
    _same(mesh, data)


@pytest.mark.slow
def test_a_sequence_group_scores_with_its_teacher_what_one_rank_scores(tmp_path):
    # on-policy distillation: each group's teacher scores the group's rows once, through the same all-to-all
    distill = ["algo=distill", "algo.teacher=tiny", "algo.distill_coef=0.5"]
    sharded = _run(tmp_path / "sp2", "hardware.learner_ranks=2", "learner.sequence_parallel=2", *distill)
    whole = _run(tmp_path / "one", "hardware.learner_ranks=1", *distill)
    _same(sharded, whole)
    gaps = [(a["distill/reverse_kl"], b["distill/reverse_kl"]) for a, b in zip(sharded[1], whole[1])]
    assert all(a == pytest.approx(b, rel=1e-4, abs=1e-7) for a, b in gaps) and any(abs(b) > 1e-4 for _, b in gaps)
