"""Engines kept warm between runs (engine.keep_warm_s, rlgen.runtime.cluster.kept_engines), on a local Ray cluster on CPU: the next
run with the same settings takes the engines over and gives them its own starting weights; a run with other
settings, or with keep_warm_s=0, stops them; past keep_warm_s the cluster's head takes it down."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime.cluster.dead_runs import kept_sessions, same_process, start_time
from rlgen.runtime.run import run_training

BASE = ["progress=false", "steps=2", "checkpoint.every=0"]


def _train(out: Path, *overrides: str) -> tuple[dict, dict, list[dict]]:
    summary = run_training(build_plan(compose_run_config([*BASE, *overrides])), out)
    status = json.loads((out / "status.json").read_text())
    return summary, status, read_jsonl(out / "metrics.jsonl")


def _alive(pid: int) -> bool:
    return start_time(pid) is not None


@pytest.mark.slow
def test_next_run_takes_the_kept_engines_over(tmp_path, no_kept):
    first, status1, rec1 = _train(tmp_path / "a", "engine.keep_warm_s=120")
    engine_pid = status1["actors"]["engine0"]
    kept = kept_sessions()
    assert len(kept) == 1 and _alive(engine_pid)
    assert "kept_warm" not in first["startup"]["actors"]["engine0"]

    second, status2, rec2 = _train(tmp_path / "b", "engine.keep_warm_s=120")
    assert status2["actors"]["engine0"] == engine_pid  # the same engine process
    assert second["startup"]["actors"]["engine0"]["kept_warm"] == 1
    assert "wake (kept warm)" in second["startup"]["actors"]["engine0"]["steps"]
    # the engine took its model folder's weights back when the first run ended, so this run's first batch did not
    # wait for the learner's first push (none was sent); it generated with this run's starting weights, not the
    # ones the first run trained: the same first step
    assert "learners and weight transport (beside the first batch)" in second["startup"]["phases"]
    assert "first weight push" not in second["startup"]["phases"]
    assert rec2[0]["reward_mean"] == pytest.approx(rec1[0]["reward_mean"])
    assert rec2[0]["mismatch/max_abs_delta"] == pytest.approx(rec1[0]["mismatch/max_abs_delta"], abs=1e-6)
    assert len(kept_sessions()) == 1

    # keep_warm_s=0 stops the kept engines before this run starts, and keeps nothing at its end
    third, status3, _ = _train(tmp_path / "c", "engine.keep_warm_s=0")
    assert not _alive(engine_pid)
    assert "kept_warm" not in third["startup"]["actors"]["engine0"]
    assert kept_sessions() == []


@pytest.mark.slow
def test_kept_cluster_ends_after_keep_warm_s(tmp_path, no_kept):
    _, status, _ = _train(tmp_path / "a", "engine.keep_warm_s=4", "steps=1")
    (session, marker), = kept_sessions()
    head, engine_pid = marker["head"], status["actors"]["engine0"]
    assert same_process(head) and _alive(engine_pid)
    deadline = time.monotonic() + 60
    while (same_process(head) or _alive(engine_pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not same_process(head) and not _alive(engine_pid)
    assert kept_sessions() == []
    assert not (session / "rlgen_driver.json").exists()


@pytest.mark.slow
def test_other_settings_stop_the_kept_engines(tmp_path, no_kept):
    _, status1, _ = _train(tmp_path / "a", "engine.keep_warm_s=120", "steps=1")
    engine_pid = status1["actors"]["engine0"]
    second, status2, _ = _train(tmp_path / "b", "engine.keep_warm_s=120", "steps=1", "engine.max_num_seqs=32")
    assert status2["actors"]["engine0"] != engine_pid and not _alive(engine_pid)
    assert "kept_warm" not in second["startup"]["actors"]["engine0"]
    assert len(kept_sessions()) == 1  # the second run's engines, kept in turn


@pytest.mark.slow
def test_a_kept_engine_that_died_is_started_anew(tmp_path, no_kept):
    import os
    import signal

    _, status1, _ = _train(tmp_path / "a", "engine.keep_warm_s=120", "steps=1")
    engine_pid = status1["actors"]["engine0"]
    os.kill(engine_pid, signal.SIGKILL)
    second, status2, records = _train(tmp_path / "b", "engine.keep_warm_s=120", "steps=1")
    assert status2["actors"]["engine0"] != engine_pid and records
    assert "kept_warm" not in second["startup"]["actors"]["engine0"]


def _ray_processes(session: Path) -> list[int]:
    """The GCS server and raylet of a Ray session (their command lines name its folder)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ("gcs_server" in cmd or "raylet" in cmd) and session.name in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_a_kept_cluster_whose_gcs_is_gone_is_not_joined(tmp_path, no_kept):
    # Ray's own processes stopped under the head that kept the cluster (as `ray stop --force` does, which leaves
    # that head and its marker): the next run with the same settings must start a new cluster rather than wait
    # on the dead GCS, which ray.init retries for minutes
    import os
    import signal

    _train(tmp_path / "a", "engine.keep_warm_s=120", "steps=1")
    (session, marker), = kept_sessions()
    pids = _ray_processes(session)
    assert pids and marker["head"]["pid"] not in pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    t0 = time.time()
    second, _, records = _train(tmp_path / "b", "engine.keep_warm_s=120", "steps=1")
    assert records and "kept_warm" not in second["startup"]["actors"]["engine0"]
    assert time.time() - t0 < 150  # before the check, ray.init retried the dead GCS past 200 s here
