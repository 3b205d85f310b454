"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

import dataclasses
import json

import pytest


@pytest.fixture(scope="session")
def local_model(tmp_path_factory):
    """A Hugging Face folder made here (no hub): a BPE tokenizer trained on GSM8K-shaped rows, with a ChatML
    chat template, and a random tiny Qwen2 model; plus those rows as train.jsonl and test.jsonl."""
    from rlgen.config.compose import compose_run_config
    from rlgen.models.local import build_folder, gsm8k_like

    root = tmp_path_factory.mktemp("local-model")
    rows = gsm8k_like(300, seed=0)
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:260]))
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[260:]))
    preset = dataclasses.replace(compose_run_config([]).model, max_position_embeddings=1024)
    build_folder(root / "model", preset, [r["question"] + "\n" + r["answer"] for r in rows], vocab_size=1000)
    return root


@pytest.fixture(scope="module")
def module_ray():
    """One local Ray cluster for a module's in-process runs. A run in a process already connected to Ray uses that
    cluster (runtime.cluster.actors.start_ray), so each run skips starting one of its own, and leaves it running."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, object_store_memory=512 * 2**20)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def no_placement_group_left(module_ray):
    """module_ray, and at the module's end not one placement group of its runs still reserved."""
    yield
    from ray.util import placement_group_table

    left = [g for g in placement_group_table().values() if g.get("state") != "REMOVED"]
    assert left == [], f"the module's runs left placement groups behind: {left}"


class Tripwire(Exception):
    pass


@pytest.fixture
def tripwires(monkeypatch):
    """Anything that would start a run raises, so a case that got past the checks fails loudly."""
    import ray

    import rlgen.commands.train as train

    def tripped(*args, **kwargs):
        raise Tripwire("the run started: the validation pass let this mistake through")

    monkeypatch.setattr(ray, "init", tripped)
    monkeypatch.setattr(train, "run_training", tripped)


@pytest.fixture
def no_kept():
    """No Ray cluster kept warm by an earlier run, before and after the test (and none left at its end)."""
    from rlgen.runtime.cluster.dead_runs import clean_leftovers, kept_sessions

    clean_leftovers(kept_too=True)
    yield
    clean_leftovers(kept_too=True)
    assert kept_sessions() == []
