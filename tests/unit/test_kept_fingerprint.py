"""runtime.cluster.kept_fingerprint: what a run must share with a kept Ray cluster to take it over, and the one
line that says what it does not share; local_ray refuses such a cluster; set-up's test for a failed take-over."""

from __future__ import annotations

import copy
import logging
import os
import shutil
import subprocess
import time
from types import SimpleNamespace

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.runtime.cluster import kept_fingerprint as fp
from rlgen.runtime.cluster import local_ray
from rlgen.runtime.errors import RunStopped, StopRequested
from rlgen.runtime.setup import TakeOverFailed, take_over_failed


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A working folder with a user's reward module on the import path, as a user's project would have."""
    work = tmp_path / "project"
    work.mkdir()
    (work / "my_rewards.py").write_text("def score(completion, answer):\n    return 1.0\n")
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    return work


def _take(env=None):
    return fp.take(env or {"RLGEN_CACHE_DIR": "/c"}, ["exact_match", "my_rewards:score"], [])


def test_the_same_run_may_take_it_over_and_the_rest_of_the_environment_does_not_count(folder, monkeypatch):
    kept = _take()
    monkeypatch.setenv("SOME_TERMINAL_THING", "x")  # neither a library's nor rlgen's
    assert fp.differs(kept, _take()) is None


def test_a_folder_that_is_gone_or_replaced_or_another(folder, tmp_path, monkeypatch, request):
    kept = _take()
    head = subprocess.Popen(["sleep", "60"], cwd=folder)  # stands for the cluster's head, started in that folder
    request.addfinalizer(lambda: (head.kill(), head.wait()))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert fp.differs(kept, _take()) == (f"the kept Ray cluster was started from another folder ({folder}; this "
                                         f"run: {elsewhere})")
    shutil.rmtree(folder)
    assert fp.differs(kept, _take()) == f"the kept Ray cluster was started from a folder that is gone ({folder})"
    folder.mkdir()  # a fresh checkout in its place: the cluster's processes still sit in the removed one
    monkeypatch.chdir(folder)
    assert fp.differs(kept, _take(), head.pid) == ("the kept Ray cluster was started from a folder that was "
                                                   f"replaced since ({folder})")


def test_another_python_or_other_rlgen_code(folder):
    kept, now = _take(), _take()
    now["python"] = ["/opt/py/bin/python3", "3.99.1 (main)"]
    assert fp.differs(kept, now).startswith("the kept Ray cluster runs another Python (")
    assert "this run: /opt/py/bin/python3, 3.99.1)" in fp.differs(kept, now)
    now = _take()
    now["rlgen"] = [now["rlgen"][0], "0" * 16]
    assert fp.differs(kept, now) == f"the kept Ray cluster runs other rlgen code (its source files in {fp.PACKAGE} changed since)"
    now["rlgen"] = ["/elsewhere/rlgen", "0" * 16]
    assert fp.differs(kept, now) == ("the kept Ray cluster runs other rlgen code (from "
                                     f"{fp.PACKAGE}; this run's from /elsewhere/rlgen)")


def test_source_hash_follows_every_source_file(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "conf.yaml").write_text("a: 1\n")
    first = fp.source_hash(tmp_path)
    assert fp.source_hash(tmp_path) == first
    (tmp_path / "notes.txt").write_text("not source")
    assert fp.source_hash(tmp_path) == first
    (tmp_path / "conf.yaml").write_text("a: 2\n")
    assert fp.source_hash(tmp_path) != first
    t0 = time.perf_counter()
    fp.source_hash()  # rlgen's own, every run
    assert time.perf_counter() - t0 < 1.0


def test_environment_variables_by_name_never_by_value(folder, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "secret-value")
    kept = _take({"NCCL_SOCKET_IFNAME": "eth0"})
    assert "secret-value" not in repr(kept) and "eth0" not in repr(kept)
    monkeypatch.setenv("HF_TOKEN", "another")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # rlgen sets this one itself before a cluster starts
    line = fp.differs(kept, _take({"NCCL_SOCKET_IFNAME": "eth1", "OMP_NUM_THREADS": "2"}))
    assert line == ("the kept Ray cluster was started with other environment variables (HF_TOKEN changed, "
                    "actor:NCCL_SOCKET_IFNAME changed, VLLM_LOGGING_LEVEL set, actor:OMP_NUM_THREADS set)")
    assert "secret" not in line and "another" not in line


def test_an_edited_reward_module_or_task_file(folder, monkeypatch):
    data = folder / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    kept = fp.take({}, ["my_rewards:score"], [str(data)])
    assert fp.differs(kept, fp.take({}, ["my_rewards:score"], [str(data)])) is None
    (folder / "my_rewards.py").write_text("def score(completion, answer):\n    return 0.0\n")
    assert fp.differs(kept, fp.take({}, ["my_rewards:score"], [str(data)])) == (
        "the kept Ray cluster was started with other user code (reward module my_rewards changed)")
    kept = fp.take({}, ["my_rewards:score"], [str(data)])
    data.write_text('{"prompt": "2+2=", "answer": "4"}\n')
    os.utime(data, ns=(1, 1))
    assert fp.differs(kept, fp.take({}, ["my_rewards:score"], [str(data)])) == (
        f"the kept Ray cluster was started with other user code (task file {data} changed)")


def test_of_run_reads_the_rewards_and_task_files_a_config_names(folder):
    (folder / "rows.jsonl").write_text("{}\n")
    cfg = compose_run_config(["task=jsonl", f"task.path={folder / 'rows.jsonl'}",
                              "task.reward=my_rewards:score", "+ray.env_vars.A=b"])
    seen = fp.of_run(cfg, {k: str(v) for k, v in cfg.ray.env_vars.items()})
    assert set(seen["user"]) == {"reward module my_rewards", f"task file {folder / 'rows.jsonl'}"}
    assert set(k for k in seen["env"] if k.startswith("actor:")) == {"actor:A"}


def test_a_cluster_that_says_nothing_of_its_start_is_not_taken_over(folder):
    assert fp.differs(None, _take()).endswith("(an older rlgen kept it)")
    assert fp.differs({"cwd": "/x"}, _take()).startswith("the kept Ray cluster does not say what it was started with")


def test_local_ray_refuses_a_kept_cluster_that_differs_in_one_line(folder, tmp_path, monkeypatch, caplog):
    kept = _take()
    session = tmp_path / "session_1"
    session.mkdir()
    marker = {"head": {"pid": 1}, "kept": {"key": "k1", "until": time.time() + 300, "address": "x:1",
                                           "fingerprint": kept}}
    monkeypatch.setattr(local_ray, "kept_sessions", lambda: [(session, copy.deepcopy(marker))])
    monkeypatch.setattr(local_ray, "write_marker", lambda *a, **k: pytest.fail("a cluster that differs was claimed"))
    monkeypatch.setenv("RLGEN_SOMETHING", "new")
    with caplog.at_level(logging.WARNING, logger=local_ray.__name__):
        assert local_ray._take_over("k1", _take()) is False
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["the kept Ray cluster was started with other environment variables (RLGEN_SOMETHING set); "
                     "starting a new one"]


def _run(taken_over=True, step=0, stop=False, resume=None):
    return SimpleNamespace(built=SimpleNamespace(taken_over=taken_over, resume=resume), state=SimpleNamespace(step=step),
                           services=SimpleNamespace(stop=SimpleNamespace(requested=stop)))


def test_which_failures_fall_back_to_a_cold_start():
    died = RunStopped("a learner died", exit_code=1, step=0)
    assert take_over_failed(_run(), died)
    assert take_over_failed(None, TakeOverFailed(RuntimeError("engine did not answer")))
    assert not take_over_failed(_run(taken_over=False), died)  # a cold start would fail the same way
    assert not take_over_failed(None, died)
    assert not take_over_failed(_run(step=1), died)  # a step was done: the cluster started this run's workers
    assert take_over_failed(_run(step=3, resume=SimpleNamespace(step=3)), died)
    assert not take_over_failed(_run(stop=True), died)  # a stop someone asked for
    assert not take_over_failed(_run(), StopRequested("starting Ray"))
    assert not take_over_failed(_run(), KeyboardInterrupt())
