"""A node that dies mid-run, on a cluster of real `ray start` nodes on this machine (tests/ray_nodes.py): the
engines' node's raylet is killed. With a spare node the engine is placed again there and the run finishes every
step; without one the run stops with a checkpoint and a sentence naming the node, and resume=auto finishes the
run once a node joins. Each node has 1 CPU, the size of one plan node's bundle, so the learner's node has no room
beside the learner."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path

import pytest
import ray
from rich.console import Console

from ray_nodes import RayNodes
from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.plan.checks.ray_token import set_auth_mode
from rlgen.runtime import RunStopped
from rlgen.runtime.durability.resume import identity, resolve_auto
from rlgen.runtime.run import run_training

CPU_RUN = ["hardware=2xcpu", "progress=false", "ray.share=object_store", "algo.prompts_per_step=32",
           "steps=16", "checkpoint.every=4", "timeout_s=60", "startup_timeout_s=90"]
KILL_AFTER = 5  # steps recorded before the engines' node dies


@pytest.fixture
def nodes(tmp_path, monkeypatch):
    """The nodes run without token authentication; this process joins them so too, although an earlier
    ray.init in it (with Ray's default, token mode) left that mode in Ray's cached config."""
    before = os.environ.get("RAY_AUTH_MODE")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    set_auth_mode("disabled")
    home = tmp_path / "home"
    home.mkdir()
    cluster = RayNodes(home)
    try:
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.close()
        set_auth_mode(before)


def _start(nodes: RayNodes, workers: int) -> None:
    nodes.head()
    for _ in range(workers):
        nodes.add(num_cpus=1)
    ray.init(address=nodes.address, log_to_driver=False)
    nodes.wait_for(1 + workers)


def _ip(node_id: str) -> str:
    return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)


def _kill_engine_node(nodes: RayNodes, run_dir: Path, killed: list[str]) -> threading.Thread:
    """A thread that, once KILL_AFTER steps are recorded, kills the raylet of engine0's node."""

    def kill() -> None:
        metrics, deadline = run_dir / "metrics.jsonl", time.time() + 240
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= KILL_AFTER):
            if time.time() > deadline:
                return
            time.sleep(0.05)
        pid = json.loads((run_dir / "status.json").read_text())["actors"]["engine0"]
        killed.append(nodes.kill_raylet_of(pid))

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_an_engine_whose_node_dies_is_placed_again_on_a_spare_node(nodes, tmp_path):
    _start(nodes, workers=3)  # the engine's node, the learner's node, a spare
    run_dir, killed, out = tmp_path / "run", [], io.StringIO()
    killer = _kill_engine_node(nodes, run_dir, killed)
    run_training(build_plan(compose_run_config(CPU_RUN)), run_dir, Console(file=out, width=400))
    killer.join(timeout=5)
    assert killed and killed[0], "the engine's node was not killed"
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(16))
    assert records[-1]["engine_restarts"] == 1
    said = " ".join(out.getvalue().split())
    assert f"its node {_ip(killed[0])} ({killed[0][:8]}) left the Ray cluster; placed again on " in said, said
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


# make test-all only; in make test: a lost node: test_an_engine_whose_node_dies_is_placed_again_on_a_spare_node
@pytest.mark.long
def test_without_room_the_run_stops_naming_the_node_and_resume_auto_finishes_once_a_node_joins(nodes, tmp_path):
    _start(nodes, workers=2)  # the engine's node and the learner's node, each full
    run_dir, killed = tmp_path / "run", []
    cfg = compose_run_config(CPU_RUN)
    killer = _kill_engine_node(nodes, run_dir, killed)
    with pytest.raises(RunStopped) as info:
        run_training(build_plan(cfg), run_dir, Console(quiet=True))
    killer.join(timeout=5)
    err = info.value
    assert killed and killed[0], "the engine's node was not killed"
    assert err.exit_code == 1 and str(err) == (
        f"the node {_ip(killed[0])} ({killed[0][:8]}) left the Ray cluster with engine0 on it, and no other node has room "
        "for engine0; resume=auto continues the run once the cluster has the resources again"), str(err)
    assert err.checkpoint is not None and Path(err.checkpoint).name == f"step_{err.step:06d}"
    assert err.step >= KILL_AFTER

    nodes.add(num_cpus=1)  # the plan's second node comes back
    nodes.wait_for(3)
    point, why = resolve_auto(run_dir, None, identity(build_plan(cfg).config, 1))
    assert point is not None, why
    run_training(build_plan(cfg), run_dir, Console(quiet=True), resume=point)
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == list(range(16))
