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
