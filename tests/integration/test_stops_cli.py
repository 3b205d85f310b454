"""`rlgen train` as a user runs it, stopped from outside: Ctrl-C and SIGTERM (to the driver or to its whole
process group) give one line, exit 130/143, a checkpoint and no Ray process left behind, and `resume=auto`
finishes the run; `kill -9` of the engine worker mid-run ends in a finished run with one engine restart; after
`kill -9` of the driver, the next run stops what its Ray cluster left behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlgen.metrics.sink import read_jsonl
from rlgen.runtime.durability.checkpoint_folder import is_complete, list_checkpoints
from rlgen.runtime.durability.status_file import read_status

TRAIN = [sys.executable, "-m", "rlgen.cli", "train", "progress=false", "algo.prompts_per_step=8"]


def _start(cwd: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    # A session of its own, so a signal can go to the whole process group as a terminal's Ctrl-C does.
    return subprocess.Popen([*TRAIN, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)


def _run_dir(cwd: Path) -> Path:
    found = sorted(cwd.glob("outputs/*/*/status.json"))
    assert len(found) == 1, found
    return found[0].parent


def _wait_for_steps(cwd: Path, proc: subprocess.Popen, n: int, timeout_s: float = 180) -> Path:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        for path in cwd.glob("outputs/*/*/metrics.jsonl"):
            if len(path.read_text().splitlines()) >= n:
                return path.parent
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the run did not reach {n} steps within {timeout_s} s")


def _finish(proc: subprocess.Popen, timeout_s: float = 240) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout_s)
    return proc.returncode, out


def _ray_processes(session_dir: str | None) -> list[str]:
    """Processes whose command line names the run's Ray session."""
    if not session_dir:
        return []
    name, found = Path(session_dir).name, []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if name in cmd:
            found.append(cmd[:120])
    return found


def _no_ray_left(status: dict) -> None:
    deadline = time.time() + 15
    while _ray_processes(status.get("ray_session")) and time.time() < deadline:
        time.sleep(0.5)
    assert _ray_processes(status.get("ray_session")) == []


# Ctrl-C reaches the terminal's whole process group; SIGTERM comes to the driver alone, as from `kill <pid>`
# or a container stop (to the whole group, as from a scheduler or `timeout`: see the test after this one).
@pytest.mark.parametrize("sig, code, name, group", [(signal.SIGINT, 130, "Ctrl-C", True),
                                                    pytest.param(signal.SIGTERM, 143, "SIGTERM", False,
                                                                 marks=pytest.mark.long)])  # make test-all only
def test_a_signal_stops_with_one_line_and_resume_auto_finishes(tmp_path, sig, code, name, group):
    proc = _start(tmp_path, "steps=30")
    run = _wait_for_steps(tmp_path, proc, 5)
    (os.killpg if group else os.kill)(proc.pid, sig)
    rc, out = _finish(proc)
    assert rc == code, out[-2000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    stop_lines = [ln for ln in out.splitlines() if "stopped at step" in ln]
    assert len(stop_lines) == 1 and out.rstrip().endswith(stop_lines[0])
    assert f"({name})" in stop_lines[0] and "resume with: rlgen train" in stop_lines[0]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped" and status["exit_code"] == code
    assert Path(status["checkpoint"]).name == f"step_{status['step']:06d}"
    _no_ray_left(status)

    resumed = subprocess.run([*TRAIN, "steps=30", "resume=auto"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _run_dir(tmp_path) == run  # it continued in the same directory and left no other behind
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(30))
    assert json.loads((run / "status.json").read_text())["state"] == "finished"


def _of_session(session_dir: str | None) -> list[str]:
    """Live processes that name the Ray session in their command line or hold a file open in it (workers and
    agents show only a ray:: title; the head process only its files)."""
    if not session_dir:
        return []
    name, found = Path(session_dir).name, []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        links = []
        for fd in fds:
            with contextlib.suppress(OSError):  # closed meanwhile
                links.append(os.readlink(fd))
        if name in cmd or any(name in link for link in links):
            found.append(f"{proc.name} {cmd[:100]}")
    return found


def _in_group(pgid: int) -> list[str]:
    """Live processes of the process group pgid."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and fields[2] == str(pgid):
            found.append(proc.name)
    return found


def _wait_for(check, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while not check():
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_sigterm_to_the_whole_process_group_stops_cleanly_and_resume_auto_finishes(tmp_path):
    """A scheduler or `timeout` signals the whole group: Ray's processes, in a session of their own, do not get
    it, so the learner writes the stop's checkpoint, and the driver then takes its cluster down."""
    args = ("steps=40", "checkpoint.every=5")
    proc = _start(tmp_path, *args)
    run = _wait_for_steps(tmp_path, proc, 5)
    session = json.loads((run / "status.json").read_text())["ray_session"]
    assert len(_of_session(session)) > 1  # the driver and Ray's processes
    assert _in_group(proc.pid) == [str(proc.pid)]  # none of Ray's processes is in the driver's group
    os.killpg(proc.pid, signal.SIGTERM)
    t0 = time.time()
    rc, out = _finish(proc, timeout_s=120)
    assert rc == 143, out[-2000:]
    assert time.time() - t0 < 120
    assert "Traceback" not in out
    stop_lines = [ln for ln in out.splitlines() if "stopped at step" in ln]
    assert len(stop_lines) == 1 and "(SIGTERM)" in stop_lines[0] and "; checkpoint " in stop_lines[0], out[-2000:]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped" and status["exit_code"] == 143
    ckpt = Path(status["checkpoint"])
    assert ckpt.name == f"step_{status['step']:06d}" and is_complete(ckpt) and list_checkpoints(run)[-1] == ckpt
    assert _wait_for(lambda: not _in_group(proc.pid), 10), _in_group(proc.pid)
    assert _wait_for(lambda: not _of_session(status["ray_session"]), 15), _of_session(status["ray_session"])
    _no_ray_left(status)

    resumed = subprocess.run([*TRAIN, *args, "resume=auto"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _run_dir(tmp_path) == run
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(40))
    assert json.loads((run / "status.json").read_text())["state"] == "finished"


def test_after_kill_9_of_the_driver_its_ray_stops_by_itself_and_resume_continues(tmp_path):
    # Ray's temp root of this test alone, so no other run on the machine cleans up before the check below.
    short = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    env = {**os.environ, "RAY_TMPDIR": str(short)}
    env.pop("RAY_ADDRESS", None)
    args = ("steps=60", "checkpoint.every=5")
    try:
        proc = _start(tmp_path, *args, env=env)
        run = _wait_for_steps(tmp_path, proc, 3)
        assert _wait_for(lambda: bool(list_checkpoints(run)), 120), "no checkpoint was written"
        session = json.loads((run / "status.json").read_text())["ray_session"]
        assert session and Path(session).parent == short / "ray"
        assert any("raylet" in p for p in _of_session(session))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        # the head sees its driver gone and takes the cluster down, with no other run needed to notice
        assert _wait_for(lambda: not _of_session(session), 60), _of_session(session)

        second = _start(tmp_path, *args, "resume=auto", env=env)
        started = lambda: (json.loads((run / "status.json").read_text()).get("pid") == second.pid  # noqa: E731
                           and json.loads((run / "status.json").read_text())["state"] in ("running", "finished"))
        assert _wait_for(started, 240), second.communicate(timeout=60)[0][-3000:]
        rc, out = _finish(second)
        assert rc == 0, out[-3000:]
        assert "Ray process(es) that an earlier run left behind" not in (run / "run.log").read_text()
        assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(60))
        status = json.loads((run / "status.json").read_text())
        assert status["state"] == "finished"
        assert _wait_for(lambda: not _of_session(status["ray_session"]), 15), _of_session(status["ray_session"])
    finally:
        for p in _of_session_pids(short):
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        shutil.rmtree(short, ignore_errors=True)


def _of_session_pids(root: Path) -> list[int]:
    """Processes left of any session under root (only when a check above failed)."""
    return [int(p.split()[0]) for d in (root / "ray").glob("session_2*") for p in _of_session(str(d))]


def test_a_second_ctrl_c_exits_at_once(tmp_path):
    proc = _start(tmp_path, "steps=200")
    run = _wait_for_steps(tmp_path, proc, 3)
    os.killpg(proc.pid, signal.SIGINT)
    # The second press comes once the first has been taken (the status says the run is stopping), as a user
    # presses again after seeing it: two signals that reach the process before its handler runs are one to Python.
    deadline = time.time() + 10
    while "next safe point" not in ((read_status(run) or {}).get("reason") or ""):
        assert time.time() < deadline, "the first Ctrl-C was not taken within 10 s"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    t0 = time.time()
    rc, out = _finish(proc, timeout_s=30)
    assert rc == 130 and time.time() - t0 < 10
    assert "Traceback" not in out
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped" and "second Ctrl-C" in status["reason"]
    _no_ray_left(status)


# make test-all only; in make test: a dead engine recreated: test_durable_runs
@pytest.mark.long
def test_kill_9_of_the_engine_worker_at_step_5_ends_in_a_finished_run(tmp_path):
    proc = _start(tmp_path, "steps=40")
    run = _wait_for_steps(tmp_path, proc, 5)
    engine_pid = json.loads((run / "status.json").read_text())["actors"]["engine0"]
    os.kill(engine_pid, signal.SIGKILL)
    rc, out = _finish(proc)
    assert rc == 0, out[-3000:]
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(40))
    assert records[-1]["engine_restarts"] == 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["engine_restarts"] == 1
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["actors"]["engine0"] != engine_pid


def test_ctrl_c_in_a_sweep_stops_the_job_cleanly_and_ends_the_sweep(tmp_path):
    proc = subprocess.Popen([*TRAIN, "-m", "steps=40,41", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    job0 = tmp_path / "sweep" / "0"
    deadline = time.time() + 180
    while not ((job0 / "metrics.jsonl").is_file() and len((job0 / "metrics.jsonl").read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    rc, out = _finish(proc)
    assert rc == 130, out[-2000:]
    assert "Traceback" not in out and len([ln for ln in out.splitlines() if "stopped at step" in ln]) == 1
    assert json.loads((job0 / "status.json").read_text())["state"] == "stopped"
    assert not (tmp_path / "sweep" / "1" / "metrics.jsonl").exists()  # the second point never started
