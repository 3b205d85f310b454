"""A node that leaves a (simulated, `ray.cluster_utils.Cluster`) cluster mid-run stops the run cleanly with the
durable-runs checkpoint, and once a node joins again, resume finishes the run."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import ray
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime import RunStopped
from rlgen.runtime.durability.resume import identity, resolve_explicit
from rlgen.runtime.run import run_training

CPU_RUN = ["hardware=2xcpu", "progress=false", "ray.share=object_store", "algo.prompts_per_step=32"]


def test_a_node_that_leaves_stops_the_run_cleanly_and_resume_finishes(tmp_path):
    """Its own cluster: the engines' node is removed mid-run, then a new node joins and the run resumes."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 0, "include_dashboard": False})
    c.add_node(num_cpus=2)
    c.add_node(num_cpus=2)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        overrides = [*CPU_RUN, "steps=40", "checkpoint.every=5", "timeout_s=60"]
        cfg = compose_run_config(overrides)

        def remove_engine_node():
            metrics = tmp_path / "metrics.jsonl"
            while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 7):
                time.sleep(0.05)
            status = json.loads((tmp_path / "status.json").read_text())
            engine_pid = status["actors"]["engine0"]
            for node in c.worker_nodes:
                if any(w.pid == engine_pid for w in _workers(node)):
                    c.remove_node(node)
                    return

        killer = threading.Thread(target=remove_engine_node, daemon=True)
        killer.start()
        with pytest.raises(RunStopped) as info:
            run_training(build_plan(cfg), tmp_path, Console(quiet=True))
        killer.join(timeout=5)
        err = info.value
        assert err.exit_code == 1 and "left the Ray cluster" in str(err), str(err)
        assert err.checkpoint is not None and Path(err.checkpoint).name == f"step_{err.step:06d}"
        assert err.step >= 7

        c.add_node(num_cpus=2)  # the plan's second node comes back
        c.wait_for_nodes()
        point = resolve_explicit(str(tmp_path), identity(build_plan(cfg).config, 1))
        run_training(build_plan(cfg), tmp_path, Console(quiet=True), resume=point)
        assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(40))
    finally:
        ray.shutdown()
        c.shutdown()


def _workers(node):
    """The worker processes a cluster_utils node started (psutil is one of Ray's dependencies)."""
    import psutil

    try:
        raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    except (KeyError, psutil.Error):
        return []
    return raylet.children(recursive=True)
