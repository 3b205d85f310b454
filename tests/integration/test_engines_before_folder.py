"""Engines asked for while the model folder is still being built (runtime.start.early_engines), on a local Ray
cluster on CPU: they start beside the build, wait for the folder, and the run is the run it would have been. Kept
warm, such an engine is taken over by the next run as any other, and a kept engine is asked to wake before the
learners are asked for."""

from __future__ import annotations

import sys
import time

import pytest
import ray.cloudpickle

from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.models import build as models
from rlgen.plan import build_plan
from rlgen.runtime.run import run_training
from rlgen.runtime.start import loaders
from rlgen.runtime.start.early_engines import FOLDER_WAIT

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the hook below, in the engines' processes
BUILD_S = 12.0  # the build is made this much slower, so the cluster is up well before the folder (Ray's
# start takes 5-10 s on a loaded 2-core machine)
HOOK_S = 0.3
HOOK_STEP = "imports before the folder"
ALGO_S = 3.0


def before_model_folder(env: dict[str, str] | None) -> str:
    """A kind's work before its model folder (vLLM imports itself here), in the engine's process."""
    time.sleep(HOOK_S)
    return HOOK_STEP


@pytest.fixture
def slow_build_and_a_hook(monkeypatch):
    real = models._build

    def slow(*args):
        time.sleep(BUILD_S)
        return real(*args)

    monkeypatch.setattr(models, "_build", slow)
    monkeypatch.setattr("rlgen.runtime.start.early_engines.before_folder_hook", lambda spec: before_model_folder)


@pytest.mark.slow
def test_engines_start_beside_the_folders_build_and_are_kept_as_any(tmp_path, slow_build_and_a_hook, no_kept,
                                                                    monkeypatch):
    overrides = ["progress=false", "steps=2", "checkpoint.every=0", f"cache_dir={tmp_path / 'cache'}",
                 "model.warm_start_steps=0", "engine.keep_warm_s=120"]
    first = run_training(build_plan(compose_run_config(overrides)), tmp_path / "a")
    startup = first["startup"]
    folder_ready = startup["began"]["model folder"] + startup["phases"]["model folder"]
    engine = startup["actors"]["engine0"]
    # asked for once the cluster was up, seconds before the folder was there; its start counts the hook and the wait
    assert startup["began"]["engines and learners"] <= engine["asked_s"] < folder_ready - 1.0, startup
    assert engine["steps"][HOOK_STEP] >= HOOK_S and engine["steps"][FOLDER_WAIT] > 0
    assert engine["asked_s"] <= engine["init_begin_s"] <= engine["ready_s"] <= startup["first_rollout_s"]
    assert engine["steps"]["weights"] > 0
    records = read_jsonl(tmp_path / "a" / "metrics.jsonl")
    assert [r["version"] for r in records] == [1, 2]

    # the folder is there now: the next run takes the kept engine over (its name and settings are those of an
    # engine asked for with the folder there), and asks it to wake before it asks for the learner, which waits for
    # the algorithm's import (made slow here)
    real_algorithm = loaders.algorithm
    monkeypatch.setattr(loaders, "algorithm", lambda cfg: (time.sleep(ALGO_S), real_algorithm(cfg))[1])
    second = run_training(build_plan(compose_run_config(overrides)), tmp_path / "b")
    kept, learner = second["startup"]["actors"]["engine0"], second["startup"]["actors"]["learner0"]
    assert kept["kept_warm"] == 1 and "wake (kept warm)" in kept["steps"] and FOLDER_WAIT not in kept["steps"]
    assert kept["ready_s"] <= learner["asked_s"] - ALGO_S / 2, second["startup"]
    again = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert again[0]["reward_mean"] == pytest.approx(records[0]["reward_mean"])  # the same starting weights
    third = run_training(build_plan(compose_run_config([*overrides[:-1], "engine.keep_warm_s=0"])), tmp_path / "c")
    assert "kept_warm" not in third["startup"]["actors"]["engine0"]
