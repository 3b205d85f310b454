"""Runs that survive, on a local Ray cluster on CPU: a run stopped at any step and resumed is exactly the run
that was never stopped; a dead engine (its actor, or the engine inside a live actor) is re-created and its
prompts scored once; a dead learner or an engine that keeps dying stops the run cleanly at a checkpoint that
resume continues; a learner out of GPU memory stops the run with the fix, keeping its last checkpoint; a disk
too small is refused before the first step, one that fills later stops the run with the command that resumes it,
and an end without room for a checkpoint keeps the trained weights."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import ray
import ray.cloudpickle
from rich.console import Console

from helpers import assert_same_steps
from rlgen.config.compose import compose_run_config
from rlgen.engines.base import EngineDead
from rlgen.engines.hf.engine import HFEngine
from rlgen.learners.torch import TorchLearner
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.plan.checks.disk_room import needed_with_headroom
from rlgen.runtime import RunStopped
from rlgen.runtime.durability.checkpoint_folder import list_checkpoints
from rlgen.runtime.durability.resume import identity, resolve_explicit
from rlgen.runtime.durability.status_file import read_status
from rlgen.runtime.run import run_training
from rlgen.runtime.signals import StopFlag

# Ray workers cannot import this test module, so its actor classes travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

BASE = ["progress=false", "algo.prompts_per_step=8", "checkpoint.every=0"]


pytestmark = pytest.mark.usefixtures("module_ray")  # one local cluster for the module's runs


class StopAtStep(StopFlag):
    """A stop request that arrives once `step` steps are logged, as Ctrl-C at that moment would."""

    def __init__(self, step: int, out: Path):
        super().__init__()
        self.at, self.metrics, self.signum = step, out / "metrics.jsonl", signal.SIGINT

    @property
    def requested(self) -> bool:
        return self.metrics.is_file() and len(self.metrics.read_text().splitlines()) >= self.at


class DiesOnce(HFEngine):
    """Exits its process (as an OOM kill would) on its `at`-th generate call, once per marker file."""

    def __init__(self, *args, marker: str, at: int = 3, **kwargs):
        super().__init__(*args, **kwargs)
        self.marker, self.at = marker, at

    def generate(self, requests, version=None):
        if self.calls + 1 >= self.at and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(self.calls))
            os._exit(1)
        return super().generate(requests, version)


class CoreDiesOnce(HFEngine):
    """The engine inside the live actor dies (as vLLM's engine core exiting would) on its `at`-th generate call,
    or on its `at`-th weight update when `in_update`, once per marker file: that call and every later one raise
    EngineDead, and health() says so; the actor itself stays up."""

    def __init__(self, *args, marker: str, at: int = 3, in_update: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.marker, self.at, self.in_update, self.dead, self.updates = marker, at, in_update, False, 0

    def _die_now(self, count: int) -> None:
        if not self.dead and count >= self.at and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(count))
            self.dead = True
        if self.dead:
            raise EngineDead(f"{self.name}: the engine core died")

    def generate(self, requests, version=None):
        self._die_now(self.calls + 1 if not self.in_update else 0)
        return super().generate(requests, version)

    def update_weights(self, weights, version):
        self.updates += 1
        self._die_now(self.updates if self.in_update else 0)
        return super().update_weights(weights, version)

    def health(self):
        return {**super().health(), "ok": not self.dead}


class AlwaysDies(HFEngine):
    """Every incarnation dies on its second generate call."""

    def generate(self, requests, version=None):
        if self.calls >= 1:
            os._exit(1)
        return super().generate(requests, version)


def _learner_dying_at(call: int, marker: str) -> type:
    class LearnerDiesOnce(TorchLearner):
        def train_step(self, batch):
            if self.calls == call and not os.path.exists(marker):
                Path(marker).write_text("died")
                os._exit(1)
            return super().train_step(batch)

    return LearnerDiesOnce


def _run(out: Path, overrides: list[str], *, stop=None, resume: bool = False, **kwargs) -> RunStopped | None:
    cfg = compose_run_config([*BASE, *overrides])
    plan = build_plan(cfg)
    point = resolve_explicit(str(out), identity(plan.config, len(plan.learners))) if resume else None
    try:
        run_training(plan, out, Console(quiet=True), resume=point, stop=stop, **kwargs)
    except RunStopped as err:
        return err
    return None


@pytest.mark.parametrize("async_steps", [0, pytest.param(1, marks=pytest.mark.long)])  # 1: make test-all only
def test_stopped_and_resumed_twice_equals_the_uninterrupted_run(tmp_path, async_steps):
    overrides = ["steps=9", f"algo.async_steps={async_steps}"]
    assert _run(tmp_path / "whole", overrides) is None
    reference = read_jsonl(tmp_path / "whole" / "metrics.jsonl")
    assert len(reference) == 9

    out = tmp_path / "stopped"
    for stop_at in (3, 6):  # stop, resume and stop again, then resume to the end
        err = _run(out, overrides, stop=StopAtStep(stop_at, out), resume=stop_at != 3)
        assert err is not None and err.step == stop_at and err.exit_code == 130
        assert Path(err.checkpoint).name == f"step_{stop_at:06d}"
        status = read_status(out)
        assert status["state"] == "stopped" and status["step"] == stop_at and status["checkpoint"] == err.checkpoint
    assert _run(out, overrides, resume=True) is None
    assert_same_steps(read_jsonl(out / "metrics.jsonl"), reference)
    assert read_status(out)["state"] == "finished"
    if async_steps:  # the stop kept the rollouts generated ahead, and the resumed run trained on them
        assert max(r["staleness"] for r in reference) == 1


def test_a_dead_engine_is_recreated_and_the_run_is_unchanged(tmp_path):
    overrides = ["steps=6"]
    assert _run(tmp_path / "whole", overrides) is None
    reference = read_jsonl(tmp_path / "whole" / "metrics.jsonl")

    marker = tmp_path / "engine-died"
    out = tmp_path / "faulty"
    assert _run(out, overrides, engine_cls=DiesOnce, engine_kwargs={"marker": str(marker), "at": 3}) is None
    assert marker.read_text() == "2"  # it died during the third step's generation
    records = read_jsonl(out / "metrics.jsonl")
    # The re-created engine got the current weights and the same requests with the same seeds: every prompt
    # was scored exactly once (the loop checks each step), and the rollouts are the ones it would have made.
    assert_same_steps(records, reference)
    assert [r["engine_restarts"] for r in records] == [0, 0, 1, 1, 1, 1]
    assert all(r["sequences"] == 8 * 8 for r in records)


def test_an_engine_lost_while_it_generates_ahead_of_the_learner_is_recreated_at_that_flight_s_version(tmp_path):
    """With async_steps=1 a flight is launched at version v while the learner trains to v+1; the engine that dies
    under it is re-created at v+1, goes back to v for that flight, then takes v+1 again: the run is unchanged.
    Its death is seen while the learner trains (the next flight is prefetched then); it is handled after the push."""
    overrides = ["steps=8", "algo.async_steps=1", "engine.num_engines=2"]
    assert _run(tmp_path / "whole", overrides) is None
    reference = read_jsonl(tmp_path / "whole" / "metrics.jsonl")
    assert max(r["staleness"] for r in reference) == 1

    marker = tmp_path / "engine-died"
    out = tmp_path / "faulty"
    assert _run(out, overrides, engine_cls=DiesOnce, engine_kwargs={"marker": str(marker), "at": 4}) is None
    records = read_jsonl(out / "metrics.jsonl")
    assert records[-1]["engine_restarts"] == 1
    assert_same_steps(records, reference)


def test_an_engine_recreated_in_a_resumed_run_starts_from_the_kept_resume_checkpoint(tmp_path):
    """The resumed run's engines start from its checkpoint's model folder; with checkpoint.keep=1 that
    checkpoint would be pruned by the next one, and an engine re-created after it could not start."""
    overrides = ["steps=7", "checkpoint.every=1", "checkpoint.keep=1"]
    out = tmp_path / "resumed"
    err = _run(out, overrides, stop=StopAtStep(2, out))
    assert err is not None and Path(err.checkpoint).name == "step_000002"
    marker = tmp_path / "engine-died"
    assert _run(out, overrides, resume=True, engine_cls=DiesOnce, engine_kwargs={"marker": str(marker), "at": 4}) is None
    assert marker.is_file()  # it died in the resumed run's fourth generation, after step 2's checkpoint was due to go
    records = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(7)) and records[-1]["engine_restarts"] == 1
    assert [c.name for c in list_checkpoints(out)] == ["step_000002", "step_000007"]  # kept while it ran


@pytest.mark.parametrize("in_update", [False, pytest.param(True, marks=pytest.mark.long)],  # True: make test-all only
                         ids=["in-generate", "in-weight-update"])
def test_an_engine_whose_core_dies_inside_a_live_actor_is_recreated_and_the_run_is_unchanged(tmp_path, in_update):
    overrides = ["steps=6"]
    assert _run(tmp_path / "whole", overrides) is None
    reference = read_jsonl(tmp_path / "whole" / "metrics.jsonl")

    marker = tmp_path / "core-died"
    out = tmp_path / "faulty"
    kwargs = {"marker": str(marker), "at": 3, "in_update": in_update}
    assert _run(out, overrides, engine_cls=CoreDiesOnce, engine_kwargs=kwargs) is None
    assert marker.read_text() == "3"
    records = read_jsonl(out / "metrics.jsonl")
    assert_same_steps(records, reference)  # the same rollouts, every prompt scored once
    restarts = [r["engine_restarts"] for r in records]
    assert restarts[-1] == 1 and restarts[0] == 0 and restarts == sorted(restarts)
    log = (out / "run.log").read_text()
    assert "engine0 died (engine0: the engine core died); re-creating it" in log


def test_a_learner_out_of_gpu_memory_stops_the_run_with_the_fix_and_keeps_its_checkpoint(tmp_path):
    from rlgen.runtime import RunError

    class OutOfMemoryAt5(TorchLearner):
        def train_step(self, batch):
            if self.calls == 4:
                import torch

                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            return super().train_step(batch)

    cfg = compose_run_config([*BASE, "steps=8", "checkpoint.every=2"])
    with pytest.raises(RunError) as info:
        run_training(build_plan(cfg), tmp_path, Console(quiet=True), learner_cls=OutOfMemoryAt5)
    message = str(info.value)
    assert message.startswith("training step 4 ran out of GPU memory on the learner (each rank's 64 sequences in one "
                              "micro-batch)")
    assert "lower algo.micro_batch_tokens (now the whole shard; a row of 12 tokens must fit)" in message
    assert "\n" not in message and "Traceback" not in message
    assert read_status(tmp_path)["state"] == "failed"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000002", "step_000004"]  # untouched
    # the micro-batch changes memory only, so the run resumes with a smaller one, from its last checkpoint
    assert _run(tmp_path, ["steps=8", "checkpoint.every=2", "algo.micro_batch_tokens=48"], resume=True) is None
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(8))


def test_an_engine_that_keeps_dying_stops_the_run_cleanly_and_resume_finishes_it(tmp_path):
    err = _run(tmp_path, ["steps=6", "engine.max_restarts=1"], engine_cls=AlwaysDies)
    assert err is not None and err.exit_code == 1
    assert "engine0 died 2 times, more than engine.max_restarts=1" in str(err)
    assert err.checkpoint is not None and Path(err.checkpoint).name == f"step_{err.step:06d}"
    assert read_status(tmp_path)["state"] == "stopped"
    assert _run(tmp_path, ["steps=6"], resume=True) is None
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(6))


def test_a_dead_learner_stops_the_run_and_resume_continues_from_the_last_checkpoint(tmp_path):
    marker = str(tmp_path / "learner-died")
    err = _run(tmp_path, ["steps=8", "checkpoint.every=2"], learner_cls=_learner_dying_at(5, marker))
    assert err is not None and err.exit_code == 1 and str(err).startswith("learner rank 0 on node ")
    assert "died during training step 5" in str(err) and "last complete checkpoint, step_000004" in str(err)
    assert err.checkpoint is not None and Path(err.checkpoint).name == "step_000004"
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 5  # step 4 ran but is redone from the checkpoint
    assert _run(tmp_path, ["steps=8", "checkpoint.every=2"], resume=True) is None
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(8))
    # checkpoint.keep=2, and the checkpoint it resumed from, kept while the resumed run ran
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000004", "step_000006", "step_000008"]


def test_a_torn_checkpoint_is_skipped_on_resume(tmp_path):
    assert _run(tmp_path, ["steps=6", "checkpoint.every=3", "checkpoint.keep=3"]) is None
    newest = list_checkpoints(tmp_path)[-1]
    assert newest.name == "step_000006"
    (newest / "COMPLETE").unlink()  # as if the process died while writing it
    assert _run(tmp_path, ["steps=8", "checkpoint.every=3", "checkpoint.keep=3"], resume=True) is None
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(8))
    resumes = (tmp_path / "resumes.jsonl").read_text()
    assert '"step": 3' in resumes  # it went back to step 3, the newest complete checkpoint


def test_background_checkpoints_resume_to_the_same_metrics_as_synchronous_ones(tmp_path):
    overrides = ["steps=8", "checkpoint.every=2", "algo.async_steps=1"]
    assert _run(tmp_path / "whole", overrides) is None
    reference = read_jsonl(tmp_path / "whole" / "metrics.jsonl")

    out = tmp_path / "background"
    background = [*overrides, "checkpoint.background=true"]
    err = _run(out, background, stop=StopAtStep(5, out))
    assert err is not None and err.step == 5
    assert not list((out / "checkpoints").glob(".step_*"))  # every background write completed or was removed
    assert _run(out, background, resume=True) is None
    assert_same_steps(read_jsonl(out / "metrics.jsonl"), reference)
    status = read_status(out)
    assert status["state"] == "finished" and status["checkpoint"].endswith("step_000008")
    log = (out / "run.log").read_text()
    assert "cost the loop" in log and "completed in the background" in log and "written in the background" in log


class SaveFailsOnce(TorchLearner):
    """Its second checkpoint write fails as a full disk would."""

    def save_checkpoint(self, path, background=False):
        self.saves = getattr(self, "saves", 0) + 1
        if self.saves == 2:
            Path(path, "learner").mkdir(parents=True, exist_ok=True)
            Path(path, "learner", "rank0.pt").write_bytes(b"half a file")
            raise OSError(28, "No space left on device")
        return super().save_checkpoint(path, background)


def test_a_failed_checkpoint_write_leaves_the_previous_one_usable(tmp_path):
    from rlgen.runtime import RunError

    cfg = compose_run_config([*BASE, "steps=6", "checkpoint.every=2"])
    with pytest.raises(RunError) as info:
        run_training(build_plan(cfg), tmp_path, Console(quiet=True), learner_cls=SaveFailsOnce)
    message = str(info.value)
    assert message == (f"checkpoint step_000004 could not be written under {tmp_path / 'checkpoints'} (the disk is "
                       "full); the newest complete checkpoint, step_000002, is kept; free space on that disk; resume "
                       f"with: resume={tmp_path} and the same settings (it continues from step_000002).")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000002"]
    assert not list((tmp_path / "checkpoints").glob(".step_*"))  # the half-written folder is gone
    assert _run(tmp_path, ["steps=6", "checkpoint.every=2"], resume=True) is None
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(6))


def test_a_run_whose_disk_cannot_hold_its_checkpoints_is_refused_before_its_first_step(tmp_path, monkeypatch):
    from rlgen.runtime.durability.disk_space import DiskTooSmall

    monkeypatch.setattr("rlgen.plan.checks.disk_room.free_bytes_at", lambda path: 2 * 2**20)
    cfg = compose_run_config([*BASE, "steps=6"])  # checkpoint.every=0: the final checkpoint still needs its room
    with pytest.raises(DiskTooSmall) as info:
        run_training(build_plan(cfg), tmp_path / "run", Console(quiet=True))
    message = str(info.value)
    assert info.value.exit_code == 2 and len(info.value.sentences()) == 1
    assert message.startswith(f"{tmp_path / 'run'} has 2.1 MB free, but this run needs about ")
    assert "its checkpoint at the end" in message and "hydra.run.dir=<folder>" in message
    assert not (tmp_path / "run").exists()  # refused before it wrote anything: no lock, status or metrics


def _free_after(monkeypatch, out: Path, lines: int, free: int) -> None:
    """The disk has room until `lines` metrics lines are written, then `free` bytes (another process filled it)."""
    def probe(path):
        metrics = out / "metrics.jsonl"
        written = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
        return 10**12 if written < lines else free

    monkeypatch.setattr("rlgen.plan.checks.disk_room.free_bytes_at", probe)


def test_a_disk_that_fills_before_a_checkpoint_stops_the_run_with_the_resume_command(tmp_path, monkeypatch):
    from rlgen.runtime import RunError

    _free_after(monkeypatch, tmp_path, 3, 2 * 2**20)
    cfg = compose_run_config([*BASE, "steps=6", "checkpoint.every=2"])
    with pytest.raises(RunError) as info:
        run_training(build_plan(cfg), tmp_path, Console(quiet=True), resume_command="rlgen train steps=6 resume=R")
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'checkpoints'} has 2.1 MB free but a checkpoint needs about ")
    assert message.endswith("; free some space on that disk, or keep fewer checkpoints (now checkpoint.keep=2); "
                            "resume with: rlgen train steps=6 resume=R (it continues from step_000002).")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000002"]
    status = read_status(tmp_path)
    assert status["state"] == "failed" and status["reason"] == message and status["step"] == 4


def test_the_end_of_a_run_without_room_for_a_checkpoint_keeps_the_trained_weights(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    cfg = compose_run_config([*BASE, "steps=3"])
    plan = build_plan(cfg)
    between = needed_with_headroom(plan.disk.model_bytes, plan.disk.small_bytes) + plan.disk.learner_bytes // 2
    _free_after(monkeypatch, tmp_path, 3, between)
    summary = run_training(plan, tmp_path, Console(quiet=True))  # ends well: exit 0
    final = tmp_path / "final_model"
    assert summary["model_path"] == str(final) and summary["checkpoint_path"] is None
    assert not list_checkpoints(tmp_path) and not list((tmp_path / "checkpoints").glob(".step_*"))
    weights = load_file(str(final / "model.safetensors"))
    initial = load_file(str(Path(summary["initial_model_path"]) / "model.safetensors"))
    assert max(float((weights[k] - initial[k]).abs().max()) for k in weights) > 0  # the trained ones
    assert (final / "config.json").is_file() and (final / "tokenizer_config.json").is_file()
    note = summary["note"]
    assert note.startswith(f"the final checkpoint did not fit ({tmp_path / 'checkpoints'} has ")
    assert f"so the trained weights alone are saved in {final}" in note and "without the optimizer state" in note
    assert "the run cannot be resumed" in note and f"(model.path={final})" in note and "\n" not in note
    status = read_status(tmp_path)
    assert status["state"] == "finished" and status["note"] == note and status["checkpoint"] is None


def test_a_checkpoint_folder_that_cannot_be_made_is_one_sentence_naming_it(tmp_path):
    from rlgen.runtime import RunError

    (tmp_path / "checkpoints").write_text("not a folder")  # as a folder without write permission would fail
    cfg = compose_run_config([*BASE, "steps=4", "checkpoint.every=2"])
    with pytest.raises(RunError) as info:
        run_training(build_plan(cfg), tmp_path, Console(quiet=True))
    message = str(info.value)
    assert message.startswith(f"checkpoint step_000002 could not be written under {tmp_path / 'checkpoints'} (")
    assert "no earlier checkpoint exists" in message and "\n" not in message
    assert read_status(tmp_path)["state"] == "failed"


class FullDisk:
    """The disk under a run fills up once `after` metrics lines are written: from then on a write that needs a new
    block fails with ENOSPC (new files, and any append: the last block has no slack left), and so does run.log's
    stream; rewriting a small file within its blocks still works, as on a real disk."""

    BLOCK = 4096

    def __init__(self, monkeypatch, after: int):
        import errno
        import logging

        import rlgen.durable
        from rlgen.metrics.sink import MetricsSink

        self.full, real_write, real_log = False, rlgen.durable._write_all, MetricsSink.log

        def write_all(fd, data):
            size = os.fstat(fd).st_size
            at = size if _appends(fd) else os.lseek(fd, 0, os.SEEK_CUR)
            # an append once full always fails (whether a line fits the last block's slack depends on the lengths
            # of the lines before it, which change whenever a record gains a metric)
            if self.full and (_appends(fd) or at + len(data) > -(-size // self.BLOCK) * self.BLOCK):
                raise OSError(errno.ENOSPC, "No space left on device")
            real_write(fd, data)

        class Full:
            def write(self, text):
                raise OSError(errno.ENOSPC, "No space left on device")

            def flush(self):
                raise OSError(errno.ENOSPC, "No space left on device")

        def log(sink, record):
            if len(sink.records) >= after and not self.full:
                self.full = True
                for h in logging.getLogger().handlers:
                    if isinstance(h, logging.FileHandler) and h.baseFilename.endswith("run.log"):
                        h.stream.close()
                        h.stream = Full()
            real_log(sink, record)

        monkeypatch.setattr(rlgen.durable, "_write_all", write_all)
        monkeypatch.setattr(MetricsSink, "log", log)


def _appends(fd: int) -> bool:
    import fcntl

    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND)


def test_a_disk_that_fills_during_a_run_stops_it_in_one_sentence_and_status_says_failed(tmp_path, monkeypatch, capfd):
    from rlgen.runtime import RunError

    FullDisk(monkeypatch, after=3)
    cfg = compose_run_config([*BASE, "steps=8", "checkpoint.every=2"])
    with pytest.raises(RunError) as info:
        run_training(build_plan(cfg), tmp_path, Console(quiet=True))
    message = str(info.value)
    assert str(tmp_path / "metrics.jsonl") in message and "the disk is full" in message and "\n" not in message
    assert message.endswith(f"; free space on that disk; resume with: resume={tmp_path} and the same settings (it "
                            "continues from step_000002).")
    status = read_status(tmp_path)
    assert status["state"] == "failed" and status["reason"] == message  # written in place, on the full disk
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 3  # whole lines only
    err = capfd.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err, err  # logging kept its own trouble quiet
    monkeypatch.undo()  # space freed: the run continues where it stopped
    assert _run(tmp_path, ["steps=8", "checkpoint.every=2"], resume=True) is None
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(8))


def test_partial_rollouts_carry_groups_and_a_resumed_run_is_unchanged(tmp_path):
    """algo.partial_rollouts: groups cut short in one step are finished and trained in the next, and a run stopped
    and resumed (its checkpoint keeps the groups it carried) logs the same steps as the uninterrupted one."""
    overrides = ["steps=6", "algo.async_steps=1", "algo.partial_rollouts=0.5"]
    assert _run(tmp_path / "whole", overrides) is None
    reference = read_jsonl(tmp_path / "whole" / "metrics.jsonl")
    assert len(reference) == 6
    assert sum(r["partial/carried"] >= 1 for r in reference) >= 4  # the steps' generations cut groups short ...
    # ... and the generation launched after it was collected (two steps on, with async_steps=1) finished them
    assert all(r["partial/finished_carried"] >= 1 for r in reference[2:])
    assert sum(r["partial/cut_tokens"] for r in reference) > 0  # cut in the middle of their responses
    assert max(r["staleness"] for r in reference) <= 1 + 1 * (1 + 1)  # what rlgen plan says it allows
    out = tmp_path / "stopped"
    err = _run(out, overrides, stop=StopAtStep(3, out))
    assert err is not None and err.step == 3
    assert _run(out, overrides, resume=True) is None
    assert_same_steps(read_jsonl(out / "metrics.jsonl"), reference)
