"""Checkpoint files written by a thread of the learner: host copies that training cannot change, done and
failed markers the driver waits for, one write at a time."""

from __future__ import annotations

import json

import torch

from rlgen.learners.background import BackgroundWriter, marker, to_host


def test_host_copies_are_detached_and_keep_tied_tensors_tied():
    w = torch.nn.Parameter(torch.ones(3))
    state = {"a": w, "b": w, "nested": [{"m": torch.zeros(2)}], "step": 4}
    copy = to_host(state)
    with torch.no_grad():
        w.add_(1.0)  # training goes on
    assert torch.equal(copy["a"], torch.ones(3)) and copy["a"] is copy["b"] and not copy["a"].requires_grad
    assert copy["step"] == 4 and torch.equal(copy["nested"][0]["m"], torch.zeros(2))


def test_a_background_write_marks_its_part_done_or_failed(tmp_path):
    writer = BackgroundWriter()
    written = []
    writer.run([lambda: written.append(1)], str(tmp_path / "ok"), 0, background=True)
    assert writer.wait(timeout=10) and written == [1]
    assert "seconds" in json.loads(marker(tmp_path / "ok", 0, "done").read_text())

    def full_disk():
        raise OSError(28, "No space left on device")

    writer.run([full_disk], str(tmp_path / "bad"), 1, background=True)
    assert writer.wait(timeout=10)
    failed = json.loads(marker(tmp_path / "bad", 1, "failed").read_text())
    assert failed["error"] == "OSError: [Errno 28] No space left on device"
    assert not marker(tmp_path / "bad", 1, "done").exists()


def test_a_write_at_once_raises_and_leaves_no_marker(tmp_path):
    writer = BackgroundWriter()

    def broken():
        raise PermissionError(13, "Permission denied")

    try:
        writer.run([broken], str(tmp_path), 0, background=False)
    except PermissionError:
        pass
    else:
        raise AssertionError("a synchronous write must raise its error")
    assert not (tmp_path / "learner").exists()
