"""runtime.cluster.dead_runs: the marker a local cluster's session gets, whether its driver still runs, and the scan
that stops the processes of sessions whose driver died, and only those."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlgen.runtime.cluster import dead_runs as leftovers
from rlgen.runtime.cluster.dead_runs import (
    MARKER,
    clean_leftovers,
    cluster_processes,
    identity,
    read_marker,
    remove_marker,
    same_process,
    session_members,
    start_time,
    stop_processes,
    write_marker,
)

pytestmark = pytest.mark.skipif(not leftovers.supported(), reason="reads /proc (Linux)")
SLEEPER = "import sys, time; print('up', flush=True); time.sleep(60)"


@pytest.fixture
def spawn():
    """Start a process (its first line of output says it is up); every one is killed at the end."""
    procs: list[subprocess.Popen] = []

    def start(args: list[str], **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _sleeper(spawn, *args: str) -> subprocess.Popen:
    proc = spawn([sys.executable, "-c", SLEEPER, *args])
    assert proc.stdout.readline().strip() == "up"
    return proc


def _dead_identity(spawn) -> dict:
    proc = _sleeper(spawn)
    ident = identity(proc.pid)
    proc.kill()
    proc.wait(timeout=10)
    return ident


def _session(root: Path, name: str = "session_2026-01-01_00-00-00_000001_1") -> Path:
    path = root / name
    (path / "logs").mkdir(parents=True)
    return path


def _gone(proc: subprocess.Popen, timeout_s: float = 15) -> bool:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


# -- markers and liveness -------------------------------------------------------------------------------------
def test_a_marker_round_trips_and_goes(tmp_path):
    session = _session(tmp_path)
    write_marker(session, identity(), head_pid=os.getpid())
    data = read_marker(session)
    assert data["driver"]["pid"] == os.getpid() and data["driver"]["start"] == start_time(os.getpid())
    assert data["head"]["pid"] == os.getpid()
    assert [p.name for p in session.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    remove_marker(session)
    assert read_marker(session) is None and not (session / MARKER).exists()
    remove_marker(session)  # a second time is fine


def test_an_unreadable_marker_reads_as_none(tmp_path):
    session = _session(tmp_path)
    (session / MARKER).write_text("{not json")
    assert read_marker(session) is None


def test_this_process_is_alive(tmp_path):
    assert same_process(identity())


def test_a_dead_pid_is_dead(spawn):
    ident = _dead_identity(spawn)
    assert start_time(ident["pid"]) is None
    assert not same_process(ident)


def test_a_reused_pid_with_another_start_time_is_dead():
    ident = identity()
    assert not same_process({**ident, "start": ident["start"] + 1})


def test_another_boot_is_dead():
    assert not same_process({**identity(), "boot": "not-this-boot"})


def test_a_zombie_is_dead(spawn):
    proc = spawn([sys.executable, "-c", "pass"])
    deadline = time.time() + 10
    while start_time(proc.pid) is not None and time.time() < deadline:  # ended, not yet reaped
        time.sleep(0.05)
    assert proc.returncode is None and start_time(proc.pid) is None


def test_nonsense_is_dead():
    assert not same_process(None) and not same_process({}) and not same_process({"pid": "12"})


# -- the scan -------------------------------------------------------------------------------------------------
HEAD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _head(spawn) -> tuple[subprocess.Popen, int]:
    """A stand-in for a cluster's head: a process in a session of its own with a child in that session (as Ray's
    processes are). Returns the head and its child's pid."""
    head = spawn([sys.executable, "-c", HEAD], start_new_session=True)
    return head, int(head.stdout.readline())


def _wait_gone(pid: int, timeout_s: float = 15) -> bool:
    deadline = time.time() + timeout_s
    while start_time(pid) is not None and time.time() < deadline:
        time.sleep(0.05)
    return start_time(pid) is None


def test_a_dead_drivers_session_is_cleaned_and_only_its_processes_stop(tmp_path, spawn, caplog):
    root = tmp_path / "ray"
    session = _session(root)
    head, child = _head(spawn)
    other_head, other_child = _head(spawn)  # another cluster's session, whose driver lives
    write_marker(session, _dead_identity(spawn), head_pid=head.pid)
    write_marker(_session(root, session.name + "2"), identity(), head_pid=other_head.pid)

    with caplog.at_level("WARNING", logger="rlgen.runtime.cluster.dead_runs"):
        assert clean_leftovers(root) == [session]
    assert _gone(head) and head.returncode == -signal.SIGTERM and _wait_gone(child)
    assert other_head.poll() is None and start_time(other_child) is not None
    assert read_marker(session) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "stopped 2 Ray process" in lines[0] and session.name in lines[0]
    assert clean_leftovers(root) == []  # nothing left to do


def test_a_process_that_only_names_the_session_folder_is_never_stopped(tmp_path, spawn):
    """A user's `tail -f` of a log in the session folder is not Ray's, whatever its command line names; the
    cluster's processes are found by the head's session, also once the head is gone."""
    root = tmp_path / "ray"
    session = _session(root)
    log = session / "logs" / "raylet.out"
    log.write_text("started\n")
    head, child = _head(spawn)
    tail = spawn(["tail", "-f", str(log)])
    reader = _sleeper(spawn, str(session), str(log))
    write_marker(session, _dead_identity(spawn), head_pid=head.pid)
    head.kill()  # the head is gone too: its child lives on in the head's session
    head.wait(timeout=10)
    assert cluster_processes(read_marker(session)["head"]) == [child]
    assert clean_leftovers(root) == [session]
    assert _wait_gone(child)
    assert tail.poll() is None and reader.poll() is None


def test_a_live_drivers_session_is_kept(tmp_path, spawn):
    root = tmp_path / "ray"
    session = _session(root)
    head, child = _head(spawn)
    write_marker(session, identity(), head_pid=head.pid)
    assert clean_leftovers(root) == []
    time.sleep(0.5)
    assert head.poll() is None and start_time(child) is not None and read_marker(session) is not None


def test_a_session_without_a_marker_is_kept(tmp_path, spawn):
    root = tmp_path / "ray"
    _session(root)
    head, child = _head(spawn)
    assert clean_leftovers(root) == []
    time.sleep(0.5)
    assert head.poll() is None and start_time(child) is not None


def test_the_recorded_head_stops_too(tmp_path, spawn):
    root = tmp_path / "ray"
    session = _session(root)
    head = _sleeper(spawn)  # its command line does not name the session
    write_marker(session, _dead_identity(spawn), head_pid=head.pid)
    assert clean_leftovers(root) == [session]
    assert _gone(head)


def test_nothing_happens_where_proc_is_missing(tmp_path, spawn, monkeypatch):
    root = tmp_path / "ray"
    session = _session(root)
    head, _ = _head(spawn)
    write_marker(session, _dead_identity(spawn), head_pid=head.pid)
    monkeypatch.setattr(leftovers, "supported", lambda: False)
    assert clean_leftovers(root) == []
    assert head.poll() is None and read_marker(session) is not None


def test_the_default_root_follows_ray(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert leftovers.ray_temp_root() == tmp_path / "ray"
    monkeypatch.delenv("RAY_TMPDIR")
    monkeypatch.delenv("TMPDIR", raising=False)
    assert leftovers.ray_temp_root() == Path("/tmp/ray")


# -- stopping -------------------------------------------------------------------------------------------------
def test_a_process_that_ignores_sigterm_gets_sigkill_in_bounded_time(spawn):
    proc = spawn([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "print('up', flush=True); time.sleep(60)"])
    assert proc.stdout.readline().strip() == "up"
    t0 = time.monotonic()
    assert stop_processes([proc.pid], term_wait_s=0.5, kill_wait_s=5) == []
    assert time.monotonic() - t0 < 5
    assert _gone(proc) and proc.returncode == -signal.SIGKILL


def test_stop_processes_never_signals_this_process():
    assert stop_processes([os.getpid()], term_wait_s=0.1, kill_wait_s=0.1) == []


def test_session_members_lists_a_new_session(spawn):
    proc = spawn([sys.executable, "-c", SLEEPER], start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    assert session_members(proc.pid) == [proc.pid]
    assert os.getpid() not in session_members(os.getsid(0))


# -- clusters kept warm for the next run (runtime.cluster.kept_engines) ---------------------------------------------------------
def _kept(session: Path, head: subprocess.Popen, until: float) -> None:
    write_marker(session, {}, head_pid=head.pid, kept={"until": until, "key": "k", "address": "a"})


def test_a_kept_cluster_is_left_alone_until_asked_to_stop(tmp_path, spawn):
    root = tmp_path / "ray"
    session = _session(root)
    head = _sleeper(spawn)
    _kept(session, head, time.time() + 60)
    assert [s for s, _ in leftovers.kept_sessions(root)] == [session]
    assert clean_leftovers(root) == []  # no driver, but kept: a run with the same settings may take it over
    assert head.poll() is None
    assert clean_leftovers(root, kept_too=True) == [session]  # a run that does not take it over stops it
    assert _gone(head) and leftovers.kept_sessions(root) == []


def test_a_kept_cluster_past_its_time_or_without_its_head_is_a_leftover(tmp_path, spawn):
    root = tmp_path / "ray"
    late, headless = _session(root), _session(root, "session_2026-01-01_00-00-00_000002_2")
    head = _sleeper(spawn)
    _kept(late, head, time.time() - 1)
    dead_head = spawn([sys.executable, "-c", "pass"])
    dead_head.wait(timeout=10)
    _kept(headless, dead_head, time.time() + 60)
    assert leftovers.kept_sessions(root) == []
    assert sorted(clean_leftovers(root)) == sorted([late, headless])
    assert _gone(head)


def test_kept_for_reads_only_whole_markers():
    head = identity()
    assert leftovers.kept_for({"head": head, "kept": {"until": time.time() + 5}}) is not None
    assert leftovers.kept_for({"head": head, "kept": {"until": "soon"}}) is None
    assert leftovers.kept_for({"head": head}) is None
    assert leftovers.kept_for(None) is None


def test_bench_and_validate_stop_kept_clusters_unless_they_join_a_named_one(tmp_path, spawn, monkeypatch):
    root = tmp_path / "ray"
    session = _session(root)
    head = _sleeper(spawn)
    _kept(session, head, time.time() + 60)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # they join that cluster: the kept one is not in their way
    assert leftovers.stop_kept_for_own_cluster(root) == [] and head.poll() is None
    monkeypatch.delenv("RAY_ADDRESS")  # they start a local cluster: the kept engines' GPU memory is needed
    assert leftovers.stop_kept_for_own_cluster(root) == [session]
    assert _gone(head) and leftovers.kept_sessions(root) == []
