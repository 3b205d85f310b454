"""Learner ranks that fail while a run runs, on a local Ray cluster on CPU with two torch learner ranks (gloo): a
rank killed inside a step, and a rank that hangs before the gradient all-reduce, with rollouts generated one step
ahead. Either stops the run with a checkpoint of the last whole step written by the surviving rank, in one
sentence that names the rank and says resume=auto; the resumed run's per-step metrics equal the uninterrupted
run's to 1e-6, and nothing is left running."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import ray
import ray.cloudpickle
from rich.console import Console

from helpers import assert_same_steps
from rlgen.config.compose import compose_run_config
from rlgen.learners.torch import TorchLearner, load_learner_state
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime import RunStopped
from rlgen.runtime.durability.resume import identity, resolve_explicit
from rlgen.runtime.run import run_training

# Ray workers cannot import this test module, so its actor classes travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

HANG_S = 20
# async_steps=1: the failed step trained on rollouts generated ahead with older weights, which the checkpoint keeps
OVERRIDES = ["progress=false", "algo.prompts_per_step=8", "checkpoint.every=0", "steps=5", "algo.async_steps=1",
             "hardware.learner_ranks=2", f"runtime.hang_timeout_s={HANG_S}"]


pytestmark = pytest.mark.usefixtures("module_ray")  # one local cluster for the module's runs


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    """The uninterrupted run's metrics."""
    out = tmp_path_factory.mktemp("whole")
    assert _run(out) is None
    records = read_jsonl(out / "metrics.jsonl")
    assert [r["staleness"] for r in records] == [0, 1, 1, 1, 1]
    return records


def _run(out: Path, *, resume: bool = False, **kwargs) -> RunStopped | None:
    plan = build_plan(compose_run_config(OVERRIDES))
    point = resolve_explicit(str(out), identity(plan.config, len(plan.learners))) if resume else None
    try:
        run_training(plan, out, Console(quiet=True), resume=point, **kwargs)
    except RunStopped as err:
        return err
    return None


def _rank_failing_at(call: int, marker: str, how: str, rank: int = 1) -> type:
    """Rank ``rank``, once per marker file, at its call-th step after its forward and backward and before the gradient
    all-reduce: kills its own process (how="kill"), or sleeps for good (how="hang"). The marker holds its pid and
    the time."""

    class FailingRank(TorchLearner):
        def _sum_gradients(self, step_index, denom):
            if self.rank == rank and step_index == call and not os.path.exists(marker):
                Path(marker).write_text(f"{os.getpid()} {time.time()}")
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                while True:
                    time.sleep(1)
            return super()._sum_gradients(step_index, denom)

    return FailingRank


def _assert_whole_checkpoint(err: RunStopped, step: int) -> None:
    ckpt = Path(err.checkpoint)
    assert ckpt.name == f"step_{step:06d}" and (ckpt / "COMPLETE").is_file()
    ranks = [load_learner_state(str(ckpt), r) for r in (0, 1)]
    assert [s["calls"] for s in ranks] == [step, step] and [s["version"] for s in ranks] == [step, step]


def _gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("killed", [pytest.param(1, marks=pytest.mark.long), 0])  # 1: make test-all only
def test_a_killed_learner_rank_stops_the_run_at_the_last_whole_step_and_resume_matches(tmp_path, reference, killed):
    """Rank 0 too: the survivor then writes the model folder as well, outside the broken process group."""
    marker = str(tmp_path / "killed")
    err = _run(tmp_path / "run", learner_cls=_rank_failing_at(3, marker, "kill", rank=killed))
    assert err is not None and err.exit_code == 1 and err.step == 3
    text = str(err)
    assert text.startswith(f"learner rank {killed} on node ") and "died during training step 3" in text, text
    assert f"a checkpoint of the last whole step, step_000003, written by learner rank {1 - killed}" in text, text
    assert (Path(err.checkpoint) / "model" / "config.json").is_file()
    assert text.endswith("Continue it with resume=auto."), text
    _assert_whole_checkpoint(err, 3)
    assert _run(tmp_path / "run", resume=True) is None
    assert_same_steps(read_jsonl(tmp_path / "run" / "metrics.jsonl"), reference, staleness=False)


def test_a_hung_learner_rank_is_stopped_within_the_hang_timeout_and_resume_matches(tmp_path, reference):
    marker = tmp_path / "hung"
    err = _run(tmp_path / "run", learner_cls=_rank_failing_at(2, str(marker), "hang"))
    ended = time.time()
    pid, hung_at = marker.read_text().split()
    assert err is not None and err.exit_code == 1 and err.step == 2
    assert ended - float(hung_at) < HANG_S + 30  # found within the timeout; the checkpoint and tear-down follow
    text = str(err)
    assert text.startswith("learner rank 1 on node "), text
    assert f"did not finish the gradient all-reduce of step 2 within runtime.hang_timeout_s={HANG_S}" in text, text
    assert "a checkpoint of the last whole step, step_000002, written by learner rank 0" in text, text
    _assert_whole_checkpoint(err, 2)
    assert _gone(int(pid)), f"the hung rank's process {pid} is still running"
    # Ray's state API needs the dashboard, which the test cluster runs without; the GCS's actor table does not
    alive = [a["ActorClassName"] for a in ray._private.state.actors().values() if a["State"] != "DEAD"]
    assert alive == [], f"actors left running: {alive}"
    assert _run(tmp_path / "run", resume=True) is None
    assert_same_steps(read_jsonl(tmp_path / "run" / "metrics.jsonl"), reference, staleness=False)
