"""A kept cluster is taken over only where it starts workers as the run would (rlgen.runtime.cluster.kept_fingerprint),
and a take-over that fails ends in a cold start, never a failed run: on a local Ray cluster on CPU."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import ray.cloudpickle

from rlgen.config.compose import compose_run_config
from rlgen.engines.hf.engine import HFEngine
from rlgen.learners.torch import TorchLearner
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime.cluster.dead_runs import kept_sessions, start_time
from rlgen.runtime.run import run_training

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors below, in Ray's workers
BASE = ["progress=false", "steps=1", "checkpoint.every=0", "engine.keep_warm_s=120"]
REWARD = "def score(completion, answer):\n    return {value}\n"
FALLBACK = "the run could not start on the kept Ray cluster it took over ("


def _train(out: Path, *overrides: str, **hooks) -> tuple[dict, dict, str]:
    """A run that must finish: its summary, its status.json and its run.log."""
    summary = run_training(build_plan(compose_run_config([*BASE, *overrides])), out, **hooks)
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "finished" and len(read_jsonl(out / "metrics.jsonl")) == 1
    return summary, status, (out / "run.log").read_text()


def _alive(pid: int) -> bool:
    return start_time(pid) is not None


def _refused(log: str) -> list[str]:
    """What the run.log's one line says the kept cluster did not share with the run."""
    return [ln.split(": ", 1)[1].removesuffix("; starting a new one") for ln in log.splitlines()
            if ln.endswith("; starting a new one")]


# make test-all only; in make test: keep-warm: test_keep_warm.py
@pytest.mark.long
@pytest.mark.slow
def test_a_kept_cluster_that_would_start_workers_otherwise_is_refused(tmp_path, no_kept, monkeypatch):
    project = tmp_path / "project"  # the folder the runs start from, with the user's reward module
    project.mkdir()
    (project / "user_reward.py").write_text(REWARD.format(value="1.0"))
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    runs = iter("abcd")

    def train_here() -> tuple[int, dict, str]:
        summary, status, log = _train(tmp_path / next(runs), "task.reward=user_reward:score")
        return status["actors"]["engine0"], summary["startup"]["actors"]["engine0"], log

    first, _, log = train_here()
    assert _refused(log) == []

    # an edited reward module: the run starts cold, with one line saying why, and keeps its own cluster
    (project / "user_reward.py").write_text(REWARD.format(value="0.5"))
    second, engine, log = train_here()
    assert _refused(log) == ["the kept Ray cluster was started with other user code (reward module user_reward "
                             "changed)"]
    assert second != first and not _alive(first) and "kept_warm" not in engine
    assert len(kept_sessions()) == 1

    # an environment variable that reaches the actors
    monkeypatch.setenv("RLGEN_KEPT_SAFE_TEST", "1")
    third, engine, log = train_here()
    assert _refused(log) == ["the kept Ray cluster was started with other environment variables "
                             "(RLGEN_KEPT_SAFE_TEST set)"]
    assert third != second and not _alive(second) and "kept_warm" not in engine

    # the folder the cluster started from is replaced (a fresh checkout in its place): its raylet and workers
    # would start in the removed one
    monkeypatch.chdir(tmp_path)
    shutil.rmtree(project)
    project.mkdir()
    (project / "user_reward.py").write_text(REWARD.format(value="0.5"))
    monkeypatch.chdir(project)
    fourth, engine, log = train_here()
    assert _refused(log) == [f"the kept Ray cluster was started from a folder that was replaced since ({project})"]
    assert fourth != third and not _alive(third) and "kept_warm" not in engine
    assert len(kept_sessions()) == 1


class TakeOverFailsOnce(HFEngine):
    """Its take-over fails (as an engine that cannot wake would) while the file ``flag`` exists, once."""

    def __init__(self, *args, flag: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.flag = flag

    def take_over(self, version):
        if os.path.exists(self.flag):
            os.unlink(self.flag)
            raise RuntimeError("this kept engine cannot wake")
        return super().take_over(version)


def _learner_dying_at_start(flag: str) -> type:
    class LearnerDiesAtStart(TorchLearner):
        """Its process exits at start (as the learner in a cluster whose folder is gone did) while ``flag``
        exists, once."""

        def __init__(self, *args, **kwargs):
            if os.path.exists(flag):
                os.unlink(flag)
                os._exit(1)
            super().__init__(*args, **kwargs)

    return LearnerDiesAtStart


# make test-all only; in make test: keep-warm: test_keep_warm.py
@pytest.mark.long
@pytest.mark.slow
def test_a_take_over_that_fails_falls_back_to_a_cold_start(tmp_path, no_kept):
    engine_flag, learner_flag = tmp_path / "engine.flag", tmp_path / "learner.flag"
    hooks = {"engine_cls": TakeOverFailsOnce, "engine_kwargs": {"flag": str(engine_flag)}}
    _, status, _ = _train(tmp_path / "a", **hooks)
    first = status["actors"]["engine0"]
    (session, marker), = kept_sessions()

    # a learner that dies at start on the cluster taken over (it starts beside the first batch, so its death
    # surfaces in the loop): the run starts again on a new cluster and finishes
    learner_flag.write_text("")
    summary, status, log = _train(tmp_path / "b", learner_cls=_learner_dying_at_start(str(learner_flag)), **hooks)
    assert not learner_flag.exists()  # it did die once
    assert sum(FALLBACK in ln for ln in log.splitlines()) == 1
    second = status["actors"]["engine0"]
    assert second != first and not _alive(first) and not _alive(marker["head"]["pid"])
    assert "kept_warm" not in summary["startup"]["actors"]["engine0"]
    assert [s for s, _ in kept_sessions()] != [session] and len(kept_sessions()) == 1

    # an engine whose take-over fails: set-up fails on the cluster taken over, and the run starts cold
    engine_flag.write_text("")
    summary, status, log = _train(tmp_path / "c", **hooks)
    assert not engine_flag.exists()
    assert sum(FALLBACK in ln for ln in log.splitlines()) == 1 and "this kept engine cannot wake" in log
    assert status["actors"]["engine0"] != second and not _alive(second)
    assert "kept_warm" not in summary["startup"]["actors"]["engine0"]
