"""`rlgen train ray.address=...` joins a two-node cluster started with `ray start` under token authentication
(RAY_AUTH_MODE=token on the nodes, not in the driver's environment) and trains across both nodes; without the
token, or with a wrong one, it exits 2 with one sentence that says so. Both nodes run on this machine, with HOME
pointed at a folder of the test's own that holds the cluster's token."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rlgen.metrics.sink import read_jsonl

RAY = str(Path(sys.executable).with_name("ray"))
NODES_UP_S = 120

# Run in the cluster's token mode after the training run: the nodes alive, and the nodes the run's engine and
# learner actors ran on (Ray's actor table keeps the dead ones).
AFTER = """
import collections, json, sys, ray
ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False)
from ray._private.state import state
nodes = collections.defaultdict(set)
for actor in state.actor_table(None).values():
    name = actor.get("ActorClassName", "")
    if any(kind in name.lower() for kind in ("engine", "learner")):
        nodes[name].add(actor["Address"]["NodeID"])
print(json.dumps({"alive": sum(1 for n in ray.nodes() if n["Alive"]), "actors": {k: sorted(v) for k, v in nodes.items()}}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, short: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    return {**env, "HOME": str(home), "RAY_TMPDIR": str(short), **extra}


def _node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A Ray node in the foreground (--block) in a process group of its own, so signalling the group stops every
    Ray process it started, and only those: `ray stop` would stop every Ray process of this machine."""
    with log.open("w") as out:
        return subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats",
                                 f"--dashboard-agent-listen-port={_free_port()}", *args],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(nodes: list[subprocess.Popen], grace_s: float = 10) -> None:
    """SIGTERM to every node's process group at once, then SIGKILL to those still there after grace_s."""
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    for node in nodes:
        try:
            node.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
            node.wait(timeout=30)


def _wait_for(what: str, done, nodes: list[subprocess.Popen], logs: list[Path], timeout_s: float):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for node, log in zip(nodes, logs):
            assert node.poll() is None, f"a ray start exited while waiting for {what}: {log.read_text()[-3000:]}"
        got = done()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def cluster():
    """A head and a worker node (2 CPUs each, so each plan node of hardware=2xcpu needs a node of its own) under
    token authentication; yields (head address, the folder used as HOME that holds the token, RAY_TMPDIR)."""
    short = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    home = short / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(uuid.uuid4().hex)
    env = _env(home, short, RAY_AUTH_MODE="token")
    port = _free_port()
    logs = [short / "head.log", short / "worker.log"]
    head = ["--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false", f"--dashboard-port={_free_port()}"]
    nodes = [_node(head, env, logs[0])]
    try:
        current = short / "ray" / "ray_current_cluster"
        address = _wait_for("ray start --head", lambda: current.is_file() and current.read_text().strip(), nodes,
                            logs[:1], NODES_UP_S)
        nodes.append(_node([f"--address={address}", "--num-cpus=2"], env, logs[1]))
        _wait_for("ray start --address", lambda: "Ray runtime started" in logs[1].read_text(), nodes, logs, NODES_UP_S)
        yield address, home, short
    finally:
        _stop(nodes)
        shutil.rmtree(short, ignore_errors=True)


def _train(tmp_path: Path, env: dict[str, str], *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """rlgen train on the cluster, with the model cache the other tests build (HOME is the test's own)."""
    cache = Path("~/.cache/rlgen").expanduser()
    return subprocess.run([sys.executable, "-m", "rlgen.cli", "train", "hardware=2xcpu", "progress=false",
                           f"cache_dir={cache}", "algo.prompts_per_step=4", f"hydra.run.dir={tmp_path / 'run'}", *args],
                          env=env, capture_output=True, text=True, timeout=timeout_s)


def test_train_joins_a_token_cluster_with_the_token_in_home(cluster, tmp_path):
    address, home, short = cluster
    proc = _train(tmp_path, _env(home, short), f"ray.address={address}", "steps=2")  # no RAY_AUTH_MODE here
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(read_jsonl(tmp_path / "run" / "metrics.jsonl")) == 2
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "finished"
    after = subprocess.run([sys.executable, "-c", AFTER, address], env=_env(home, short, RAY_AUTH_MODE="token"),
                           capture_output=True, text=True, timeout=120)
    assert after.returncode == 0, after.stderr[-3000:]
    seen = json.loads(after.stdout.strip().splitlines()[-1])
    assert seen["alive"] == 2, "the run took down (part of) the cluster it joined"
    engines = {n for name, ids in seen["actors"].items() if "engine" in name.lower() for n in ids}
    learners = {n for name, ids in seen["actors"].items() if "learner" in name.lower() for n in ids}
    assert len(engines) == len(learners) == 1 and engines != learners, seen  # engines on one node, learner on the other


@pytest.mark.parametrize("how", ["ray.address", "RAY_ADDRESS", "auto"])
def test_without_the_token_the_run_says_where_to_put_it(cluster, tmp_path, how):
    address, _, short = cluster
    empty = tmp_path / "home"
    empty.mkdir()
    env = _env(empty, short, **({"RAY_ADDRESS": address} if how == "RAY_ADDRESS" else {}))
    target = {"ray.address": [f"ray.address={address}"], "auto": ["ray.address=auto"]}.get(how, [])
    proc = _train(tmp_path, env, "steps=1", *target, timeout_s=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"the Ray cluster at {address}" in proc.stderr
    assert ("wants its authentication token, and there is none on this machine; copy the head node's "
            "~/.ray/auth_token to ~/.ray/auth_token on this machine, or set RAY_AUTH_TOKEN=") in proc.stderr
    assert "Traceback" not in proc.stderr and "gcs_client" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    if how == "ray.address":  # rlgen plan shows the same sentence, as a note about this machine
        plan = subprocess.run([sys.executable, "-m", "rlgen.cli", "plan", "hardware=2xcpu", *target], env=env,
                              capture_output=True, text=True, timeout=120)
        assert "this machine cannot run it: the Ray cluster at" in " ".join(plan.stdout.split()), plan.stdout
        assert "wants its authentication token, and there is none" in " ".join(plan.stdout.split()), plan.stdout


@pytest.mark.parametrize("where", ["RAY_AUTH_TOKEN", "~/.ray/auth_token"])
def test_a_wrong_token_gets_its_own_sentence(cluster, tmp_path, where):
    address, _, short = cluster
    wrong = tmp_path / "home"
    (wrong / ".ray").mkdir(parents=True)
    extra = {}
    if where == "RAY_AUTH_TOKEN":
        extra["RAY_AUTH_TOKEN"] = uuid.uuid4().hex
    else:
        (wrong / ".ray" / "auth_token").write_text(uuid.uuid4().hex)
    proc = _train(tmp_path, _env(wrong, short, **extra), f"ray.address={address}", "steps=1", timeout_s=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"the Ray cluster at {address} refuses the authentication token found here ({where}): it is not the " \
           "cluster's" in proc.stderr
    assert "Traceback" not in proc.stderr and "gcs_client" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("mode", ["disabled", "token"])
def test_a_mode_set_here_that_cannot_join_is_named(cluster, tmp_path, mode):
    """RAY_AUTH_MODE set by the user is kept: disabled (with the right token here) cannot join a cluster that
    wants its token; token with no token here cannot join at all."""
    address, home, short = cluster
    if mode == "token":
        home = tmp_path / "home"
        home.mkdir()
    proc = _train(tmp_path, _env(home, short, RAY_AUTH_MODE=mode), f"ray.address={address}", "steps=1",
                  timeout_s=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = {"disabled": f"the Ray cluster at {address} wants its authentication token, but RAY_AUTH_MODE=disabled "
                        "here; unset RAY_AUTH_MODE",
            "token": "RAY_AUTH_MODE=token here, but there is no authentication token on this machine to join the "
                     f"Ray cluster at {address}"}[mode]
    assert said in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
