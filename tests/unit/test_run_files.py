"""The run directory's files survive a full disk (metrics.jsonl keeps whole lines, status.json its previous
content), one run holds a run directory at a time (a full disk at the start is a sentence), and a checkpoint is
refused up front when it cannot fit."""

from __future__ import annotations

import errno
import json
import os
import socket

import pytest
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.errors import UserError
from rlgen.metrics.sink import MetricsSink, keep_lines, read_jsonl
from rlgen.runtime.durability.disk_space import DiskFull, check_free_space, folder_bytes
from rlgen.runtime.durability.run_lock import (
    LOCK_FILE,
    LockInfo,
    RunDirUnwritable,
    RunLocked,
    acquire_run_lock,
    holder_alive,
    process_start,
)
from rlgen.runtime.durability.status_file import RunStatus, read_status, write_json_atomic

_real_write = os.write


def _record(step):
    return {"step": step, "reward_mean": 0.5, "loss": 0.1, "tokens_per_s": 100.0, "version": step, "staleness": 0}


def _full_disk_after(monkeypatch, nbytes):
    """os.write that writes at most ``nbytes`` of the next call's bytes, then fails as a full disk does."""
    def write(fd, data):
        _real_write(fd, bytes(data[:nbytes]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)


@pytest.fixture
def sink(tmp_path):
    s = MetricsSink(tmp_path, compose_run_config(["progress=false"]), 10, Console(quiet=True))
    yield s
    s.close({"steps": len(s.records)})


# -- metrics.jsonl -----------------------------------------------------------------------------------------
def test_a_disk_that_fills_mid_line_leaves_only_whole_lines(sink, monkeypatch):
    sink.log(_record(0))
    sink.log(_record(1))
    _full_disk_after(monkeypatch, 7)
    with pytest.raises(OSError, match=r"metrics\.jsonl: the disk is full, so a line was not written") as info:
        sink.log(_record(2))
    assert info.value.errno == errno.ENOSPC and str(sink.path) in str(info.value)
    text = sink.path.read_text()
    assert text.endswith("\n") and [r["step"] for r in read_jsonl(sink.path)] == [0, 1]
    assert [r["step"] for r in sink.records] == [0, 1]  # the lost line is not counted as logged either
    monkeypatch.setattr(os, "write", _real_write)
    sink.log(_record(2))  # space again: the next line follows the last whole one
    assert [r["step"] for r in read_jsonl(sink.path)] == [0, 1, 2]


def test_short_writes_still_land_the_whole_line(sink, monkeypatch):
    monkeypatch.setattr(os, "write", lambda fd, data: _real_write(fd, bytes(data[:5])))
    sink.log(_record(0))
    sink.log(_record(1))
    assert read_jsonl(sink.path) == [_record(0), _record(1)]


def test_a_resumed_sink_keeps_its_lines_and_appends(tmp_path):
    cfg = compose_run_config(["progress=false"])
    first = MetricsSink(tmp_path, cfg, 10, Console(quiet=True))
    for step in range(3):
        first.log(_record(step))
    first.close({})
    again = MetricsSink(tmp_path, cfg, 10, Console(quiet=True), resume_lines=2)
    again.log(_record(2))
    again.close({})
    assert [r["step"] for r in again.records] == [0, 1, 2] == [r["step"] for r in read_jsonl(again.path)]
    assert json.loads((tmp_path / "summary.json").read_text()) == {}


def test_keep_lines_that_cannot_write_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    before = "".join(json.dumps(_record(s)) + "\n" for s in range(3))
    path.write_text(before)
    _full_disk_after(monkeypatch, 10)
    with pytest.raises(OSError, match=r"metrics\.jsonl: the disk is full"):
        keep_lines(path, 1)
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


# -- status.json ---------------------------------------------------------------------------------------------
def test_status_json_keeps_its_previous_content_when_a_write_fails(tmp_path, monkeypatch):
    status = RunStatus(tmp_path, command="train")
    status.update(state="running", step=3)
    _full_disk_after(monkeypatch, 4)
    with pytest.raises(OSError, match=r"status\.json: the disk is full, so it was not rewritten") as info:
        status.update(state="finished", step=4)
    assert str(tmp_path / "status.json") in str(info.value)
    monkeypatch.setattr(os, "write", _real_write)
    assert read_status(tmp_path)["state"] == "running" and read_status(tmp_path)["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]  # no temporary file left


def test_status_json_is_synced_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    write_json_atomic(tmp_path / "status.json", {"state": "running"})

    def fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match=r"status\.json: .*, so it was not rewritten"):
        write_json_atomic(tmp_path / "status.json", {"state": "failed"})
    assert json.loads((tmp_path / "status.json").read_text()) == {"state": "running"}


# -- the run lock --------------------------------------------------------------------------------------------
def _lock_file(run_dir, **fields):
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": 1.0e9, "command": "rlgen train",
            "proc_start": None, **fields}
    (run_dir / LOCK_FILE).write_text(json.dumps(info))
    return info


def _dead_pid():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_second_run_on_a_live_lock_is_refused_with_who_holds_it(tmp_path):
    lock = acquire_run_lock(tmp_path, "rlgen train steps=5")
    held = json.loads((tmp_path / LOCK_FILE).read_text())
    assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
    assert held["command"] == "rlgen train steps=5" and held["started"] > 0
    with pytest.raises(RunLocked) as info:
        acquire_run_lock(tmp_path, "rlgen train")
    msg = str(info.value)
    assert isinstance(info.value, UserError) and len(info.value.sentences()) == 1
    assert f"pid {os.getpid()} on {socket.gethostname()}" in msg and str(tmp_path) in msg
    assert "rlgen train steps=5" in msg and "resume=" in msg
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_lock_from_another_host_counts_as_alive(tmp_path):
    _lock_file(tmp_path, host="some-other-host", pid=_dead_pid())
    with pytest.raises(RunLocked, match="on some-other-host"):
        acquire_run_lock(tmp_path, "rlgen train")


def test_the_lock_of_a_dead_pid_is_taken_over(tmp_path):
    pid = _dead_pid()
    _lock_file(tmp_path, pid=pid)
    with acquire_run_lock(tmp_path, "rlgen train resume=auto") as lock:
        assert lock.took_over is not None and lock.took_over.pid == pid
        assert f"pid {pid}" in lock.stale and "no longer running" in lock.stale
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_reused_pid_does_not_keep_a_stale_lock(tmp_path):
    me = process_start(os.getpid())
    if me is None:
        pytest.skip("no /proc here to read a process's start time")
    _lock_file(tmp_path, pid=os.getpid(), proc_start=me - 1)  # same pid, another process's start time
    lock = acquire_run_lock(tmp_path, "rlgen train")
    assert lock.took_over is not None and lock.took_over.proc_start == me - 1
    lock.release()


def test_the_liveness_probe_decides(tmp_path):
    _lock_file(tmp_path, pid=_dead_pid())
    with pytest.raises(RunLocked):
        acquire_run_lock(tmp_path, "rlgen train", probe=lambda info: True)
    seen = []
    lock = acquire_run_lock(tmp_path, "rlgen train", probe=lambda info: seen.append(info) or False)
    assert len(seen) == 1 and lock.took_over == seen[0]
    lock.release()


def test_a_torn_lock_file_counts_as_stale(tmp_path):
    path = tmp_path / LOCK_FILE
    path.write_text('{"pid": 12')
    os.utime(path, (1.0e9, 1.0e9))  # long written: not a lock being created right now
    lock = acquire_run_lock(tmp_path, "rlgen train")
    assert lock.took_over is None and "unreadable" in lock.stale
    assert json.loads(path.read_text())["pid"] == os.getpid()
    lock.release()


def test_release_leaves_another_runs_lock_alone(tmp_path):
    lock = acquire_run_lock(tmp_path, "rlgen train")
    other = _lock_file(tmp_path, pid=os.getpid() + 1, started=2.0e9)  # someone took it over meanwhile
    lock.release()
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == other


@pytest.mark.parametrize("where", ["the lock file", "the folder"])
def test_a_full_disk_at_the_start_is_one_sentence_not_a_traceback(tmp_path, monkeypatch, where):
    import rlgen.runtime.durability.run_lock as run_lock

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if where == "the lock file":
        monkeypatch.setattr(run_lock, "_write_fd", full)
    else:
        monkeypatch.setattr(type(tmp_path), "mkdir", full)
    run_dir = tmp_path / "run"
    with pytest.raises(RunDirUnwritable) as info:
        acquire_run_lock(run_dir, "rlgen train")
    msg = str(info.value)
    assert isinstance(info.value, UserError) and len(info.value.sentences()) == 1
    assert msg.startswith(f"the run directory {run_dir} cannot be written (the disk is full;")
    assert "free space on that disk" in msg and "hydra.run.dir=<folder>" in msg
    assert not (run_dir / LOCK_FILE).exists()  # no half-written lock is left to refuse the next run


def test_a_run_directory_that_cannot_be_written_says_so(tmp_path, monkeypatch):
    import rlgen.runtime.durability.run_lock as run_lock

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(run_lock.os, "open", denied)
    with pytest.raises(RunDirUnwritable, match=r"\(Permission denied; .*make it writable, or choose a run directory"):
        acquire_run_lock(tmp_path / "run", "rlgen train")


def test_holder_alive_on_this_host():
    me = LockInfo.of_this_process("x")
    assert holder_alive(me)
    assert not holder_alive(LockInfo(_dead_pid(), socket.gethostname(), 1.0, "x"))


# -- free space ----------------------------------------------------------------------------------------------
def test_a_checkpoint_that_cannot_fit_is_refused_with_the_fixes(tmp_path):
    target = tmp_path / "run" / "checkpoints"  # not created yet: its nearest existing folder is probed
    probed = []
    with pytest.raises(DiskFull) as info:
        check_free_space(target, 2 * 10**9, keep=3, small_bytes=5 * 2**20,
                         free_bytes=lambda p: probed.append(p) or 10**9)
    msg = str(info.value)
    assert probed == [tmp_path] and isinstance(info.value, UserError) and info.value.exit_code == 1
    assert str(target) in msg and "1.0 GB free" in msg and "needs about 2.1 GB" in msg  # 2 GB + 5% + 5 MiB
    assert "checkpoint.keep=3" in msg and len(info.value.sentences()) == 1
    assert (info.value.path, info.value.free, info.value.need) == (target, 10**9, 2_105_242_880)


def test_a_checkpoint_that_fits_passes(tmp_path):
    check_free_space(tmp_path, 2 * 10**9, keep=2, small_bytes=5 * 2**20, free_bytes=lambda p: 3 * 10**9)
    check_free_space(tmp_path, 0, keep=2, small_bytes=5 * 2**20)  # the real disk has room for nothing plus headroom
    with pytest.raises(DiskFull):  # the headroom counts: exactly need_bytes free is not enough
        check_free_space(tmp_path, 10**9, keep=2, small_bytes=5 * 2**20, free_bytes=lambda p: 10**9)
    with pytest.raises(DiskFull):  # and so do the run's small files beside it
        check_free_space(tmp_path, 0, keep=2, small_bytes=5 * 2**20, free_bytes=lambda p: 4 * 2**20)


def test_folder_bytes_sums_files_once(tmp_path):
    assert folder_bytes(tmp_path / "missing") == 0
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "w.bin").write_bytes(b"x" * 1000)
    (tmp_path / "b.json").write_bytes(b"y" * 24)
    os.link(tmp_path / "a" / "w.bin", tmp_path / "linked.bin")  # a hard link takes no more room
    assert folder_bytes(tmp_path) == 1024


def test_a_stop_signal_during_a_status_write_neither_deadlocks_nor_is_lost(tmp_path, monkeypatch):
    """The first SIGTERM's handler records the stop in status.json. When the signal lands while the same thread is
    writing status.json (a checkpoint's update), the handler's update must not wait on the lock that thread holds
    (it did: the run hung) and must not be lost: it is written right after."""
    import threading

    import rlgen.runtime.durability.status_file as status_mod

    status = RunStatus(tmp_path, command="train")
    real, fired = status_mod.rewrite_small, []

    def write_then_signal(path, text):  # the handler runs between two bytecodes of the write
        real(path, text)
        if not fired:
            fired.append(True)
            status.update(state="stopped", reason="SIGTERM; stopping at the next safe point")

    monkeypatch.setattr(status_mod, "rewrite_small", write_then_signal)
    worker = threading.Thread(target=status.update, kwargs={"state": "running", "checkpoint": "step_000005"},
                              daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the update deadlocked"
    on_disk = read_status(tmp_path)
    assert on_disk["state"] == "stopped" and on_disk["checkpoint"] == "step_000005"


def test_a_second_signal_in_the_middle_of_an_update_is_written_before_the_exit(tmp_path, monkeypatch):
    """The second Ctrl-C exits at once (os._exit) after recording why. When it comes while the main thread is in
    the middle of a status update (the first Ctrl-C's, say), its fields must reach the disk then: the interrupted
    update, which would write pending fields after its own, never resumes."""
    import rlgen.runtime.durability.status_file as status_mod

    status = RunStatus(tmp_path, command="train")
    real, fired = status_mod.rewrite_small, []

    class Exited(BaseException):  # stands in for os._exit: nothing after it runs
        pass

    def write_then_second_signal(path, text):  # the handler runs between two bytecodes of the write
        real(path, text)
        if not fired:
            fired.append(True)
            status.update_before_exit(state="stopped", reason="killed by a second Ctrl-C")
            raise Exited

    monkeypatch.setattr(status_mod, "rewrite_small", write_then_second_signal)
    with pytest.raises(Exited):
        status.update(state="stopped", reason="Ctrl-C; stopping at the next safe point")
    on_disk = read_status(tmp_path)
    assert on_disk["state"] == "stopped" and on_disk["reason"] == "killed by a second Ctrl-C"
