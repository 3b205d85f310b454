"""Real Ray nodes on this machine, each a `ray start --block` of its own: its own short temp dir, free ports,
HOME in a temp folder and token auth off. Killing a node's raylet is a node that dies; `close()` ends every
process these nodes started (their process groups), and nothing else."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 90.0
# the GCS notices a node whose raylet is gone within about 3 s, not Ray's default of about 15 s
FAST_HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
               "RAY_health_check_timeout_ms": "1000"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayNodes:
    def __init__(self, home: Path):
        self.ray = str(Path(sys.executable).with_name("ray"))
        self.env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "disabled",
                    "RAY_USAGE_STATS_ENABLED": "0", **FAST_HEALTH}
        self.env.pop("RAY_ADDRESS", None)
        self.procs: list[subprocess.Popen] = []
        self.dirs: list[Path] = []
        self.address = ""

    def _start(self, args: list[str]) -> subprocess.Popen:
        tmp = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
        self.dirs.append(tmp)
        ports = [f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
                 f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                 f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]
        log = tmp / "start.log"
        with log.open("w") as out:
            proc = subprocess.Popen([self.ray, "start", "--block", f"--temp-dir={tmp}", "--disable-usage-stats",
                                     "--include-log-monitor=false", *ports, *args],
                                    env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        deadline = time.time() + START_TIMEOUT_S
        while "will now block forever" not in log.read_text():  # ray start --block says so once the node is up
            assert proc.poll() is None and time.time() < deadline, f"ray start failed: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        return proc

    def head(self) -> str:
        port = free_port()
        self._start(["--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false"])
        self.address = f"127.0.0.1:{port}"
        return self.address

    def add(self, num_cpus: int) -> None:
        self._start([f"--address={self.address}", f"--num-cpus={num_cpus}"])

    def wait_for(self, alive: int) -> None:
        """Until the cluster has ``alive`` nodes (the head included); needs ray.init done."""
        import ray

        deadline = time.time() + START_TIMEOUT_S
        while sum(n["Alive"] for n in ray.nodes()) < alive:
            assert time.time() < deadline, f"the cluster did not reach {alive} nodes: {ray.nodes()}"
            assert all(p.poll() is None for p in self.procs[-1:]), "ray start exited"
            time.sleep(0.5)

    def kill_raylet_of(self, pid: int) -> str:
        """SIGKILL the raylet that started process ``pid`` (an actor's worker): its node dies. Its node id."""
        import psutil

        proc = psutil.Process(pid)
        while proc is not None and proc.name() != "raylet":
            proc = proc.parent()
        assert proc is not None, f"no raylet above process {pid}"
        node_id = next((a.split("=", 1)[1] for a in proc.cmdline() if a.startswith("--node_id=")), "")
        proc.send_signal(signal.SIGKILL)
        return node_id

    def close(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
