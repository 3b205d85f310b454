"""Mistakes as a user meets them, in a fresh process: one sentence and exit 2 within 10 s, before Ray starts;
and failures that only show while running (a reward that raises, an actor that raises) end in one sentence
naming the function or actor, with the detail in the run's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray.cloudpickle
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.engines.hf.engine import HFEngine
from rlgen.learners.torch import TorchLearner
from rlgen.plan import build_plan
from rlgen.runtime import RunError
from rlgen.runtime.durability.status_file import read_status
from rlgen.runtime.run import run_training

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
LIMIT_S = 10.0


def rlgen(*args: str, cwd: Path, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rlgen.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200", **(env or {})})
    return proc, time.perf_counter() - t0


def _refused(proc: subprocess.CompletedProcess, wall: float, phrase: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-2000:]
    assert "Traceback" not in out
    assert phrase in proc.stderr
    assert "Started a local Ray instance" not in out  # it ended before Ray started
    assert wall < LIMIT_S, f"took {wall:.1f} s"


def test_a_typo_in_train_is_one_line_from_a_fresh_process(tmp_path):
    proc, wall = rlgen("train", "algo.lrr=0.1", cwd=tmp_path)
    _refused(proc, wall, "algo.lrr is not a setting of algo")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "outputs").exists()


def test_a_gpu_preset_on_a_machine_without_gpus_fails_at_once(tmp_path):
    from rlgen.plan.checks.machine import has_package, local_gpus

    if local_gpus() or has_package("vllm"):
        pytest.skip("this machine has a GPU or vllm")
    proc, wall = rlgen("train", "engine=vllm", "hardware=1xh100", "model=qwen2_5_0_5b", cwd=tmp_path)
    _refused(proc, wall, "needs 1 GPU(s), but this machine has none")
    assert "vllm package, which is not installed" in proc.stderr


def test_a_50_mb_line_is_refused_without_tokenizing_it(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "' + "7" * 50 * 2**20 + '", "answer": "1"}\n')
    proc, wall = rlgen("train", "task=jsonl", f"task.path={rows}", cwd=tmp_path)
    _refused(proc, wall, "rows.jsonl:2: the prompt is 52,428,800 characters long")


def test_plan_prints_the_config_and_writes_json_into_a_new_folder(tmp_path):
    proc, _ = rlgen("plan", "--cfg", "job", "steps=7", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "steps: 7" in proc.stdout and "algo:" in proc.stdout
    target = tmp_path / "new" / "folder" / "plan.json"
    proc, _ = rlgen("plan", "--json", str(target), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(target.read_text())["engine_kind"] == "hf"


def test_plan_shows_what_this_machine_lacks_as_a_note(tmp_path):
    from rlgen.plan.checks.machine import local_gpus

    if local_gpus():
        pytest.skip("this machine has a GPU")
    proc, _ = rlgen("plan", "engine=vllm", "hardware=1xh100", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "this machine cannot run it: hardware=1xh100 needs 1 GPU(s)" in proc.stdout


# -- failures that only show while running ------------------------------------------------------------------
def test_a_reward_that_raises_mid_run_is_one_sentence_and_the_traceback_is_in_run_log(tmp_path):
    (tmp_path / "picky_reward.py").write_text(
        "def score(completion, answer):\n"
        "    if completion and completion != answer:\n"
        "        raise ValueError(f'cannot score {completion!r}')\n"
        "    return float(completion == answer)\n"
    )
    proc, _ = rlgen("train", "steps=3", "progress=false", "task.reward=picky_reward:score", "hydra.run.dir=run",
                    cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("run stopped:")]
    assert len(line) == 1, proc.stderr
    assert "task.reward=picky_reward:score raised ValueError: cannot score" in line[0]
    assert "at step 0" in line[0] and f"details: {tmp_path / 'run' / 'run.log'}" in line[0]
    log = (tmp_path / "run" / "run.log").read_text()
    assert "Traceback" in log and "raise ValueError" in log
    status = read_status(tmp_path / "run")
    assert status["state"] == "failed" and "picky_reward:score" in status["reason"]


class RaisingEngine(HFEngine):
    def generate(self, requests, version=None):
        if self.calls >= 1:
            raise ValueError("the engine cannot go on")
        return super().generate(requests, version)


class RaisingLearner(TorchLearner):
    def train_step(self, batch):
        if self.calls >= 1:
            raise RuntimeError("the learner cannot go on")
        return super().train_step(batch)


@pytest.mark.parametrize("hook, message", [
    ({"engine_cls": RaisingEngine}, "generation for step 1: engine0 raised ValueError: the engine cannot go on"),
    ({"learner_cls": RaisingLearner}, "training step 1: learner0 raised RuntimeError: the learner cannot go on"),
])
def test_an_actor_that_raises_is_named_in_one_sentence(tmp_path, hook, message):
    cfg = compose_run_config(["progress=false", "steps=4", "algo.prompts_per_step=4"])
    with pytest.raises(RunError) as info:
        run_training(build_plan(cfg), tmp_path, Console(quiet=True), **hook)
    assert str(info.value) == message
    assert "Traceback" in (tmp_path / "run.log").read_text()
    assert read_status(tmp_path)["state"] == "failed"


# make test-all only; in make test: test_a_reward_that_raises_mid_run_is_one_sentence_and_the_traceback_is_in_run_log
@pytest.mark.long
@pytest.mark.parametrize("extra", [["algo.async_steps=1"], ["task.reward_workers=1"]])
def test_a_reward_that_raises_while_the_learner_trains_is_the_same_one_sentence(tmp_path, monkeypatch, extra):
    # async_steps=1: the next step's rollouts are scored while the learner trains (prefetch); a worker pool: the
    # error comes back from another process. Either way the run stops with the same sentence.
    (tmp_path / "picky_reward2.py").write_text(
        "def score(completion, answer):\n"
        "    if completion and completion != answer:\n"
        "        raise ValueError('cannot score ' + repr(completion))\n"
        "    return float(completion == answer)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    cfg = compose_run_config(["progress=false", "steps=4", "algo.prompts_per_step=4",
                              "task.reward=picky_reward2:score", *extra])
    with pytest.raises(RunError, match=r"task.reward=picky_reward2:score raised ValueError: cannot score .* at step 0"):
        run_training(build_plan(cfg), tmp_path / "run", Console(quiet=True))
    assert read_status(tmp_path / "run")["state"] == "failed"
