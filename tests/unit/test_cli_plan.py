"""`rlgen plan` and the command dispatcher: first as a user runs them, in a fresh process; then in-process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan.preflight import preflight

PLAN_WALL_LIMIT_S = 3.0


def rlgen(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "COLUMNS": "160", "NO_COLOR": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "rlgen.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, time.perf_counter() - start


def table_rows(text: str) -> dict[str, list[str]]:
    """Rows of the placement table, by actor name."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line)]
        cells = [c for c in cells if c]
        if cells and re.fullmatch(r"(engine|learner)\d+", cells[0]):
            rows[cells[0]] = cells[1:]
    return rows


def assert_clean_failure(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {proc.stderr!r}"
    assert lines[0].startswith("error: ")
    return lines[0]


def test_plan_tp2_on_8xh100(tmp_path):
    proc, wall = rlgen("plan", "engine=vllm_tp2", "hardware=8xh100", "hardware.engine_gpus=4",
                       "+engine.env.VLLM_USE_V1=1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = table_rows(proc.stdout)
    assert rows["engine0"] == ["vllm", "0", "0,1", "2"]
    assert rows["engine1"] == ["vllm", "0", "2,3", "2"]
    assert "engine2" not in rows
    assert [rows[f"learner{r}"][2] for r in range(4)] == ["4", "5", "6", "7"]
    assert "learner4" not in rows
    assert "2 vllm engine(s) of TP 2 on 4 GPU(s); 4 learner rank(s) on 4 GPU(s)" in proc.stdout
    assert "nccl" in proc.stdout
    assert "VLLM_USE_V1" in proc.stdout  # the dropped variable is reported as a note
    assert re.search(r"engine\.gpu_memory_utilization\s*│ 0\.9 ", proc.stdout)  # engines on their own GPUs: vLLM's default
    assert "recipe tiny" in proc.stdout  # where the null algo values came from
    assert wall < PLAN_WALL_LIMIT_S, (
        f"`rlgen plan` took {wall:.2f} s of wall time; it should answer in under {PLAN_WALL_LIMIT_S} s "
        "(it must not import torch, ray or vllm, or build anything)"
    )


def test_plan_json_writes_a_loadable_plan(tmp_path):
    out = tmp_path / "out.json"
    proc, _ = rlgen("plan", "engine=vllm_tp2", "hardware=8xh100", "hardware.engine_gpus=4", "--json", str(out),
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"plan written to {out}" in proc.stdout
    d = json.loads(out.read_text())
    assert [e["gpus"] for e in d["engines"]] == [[0, 1], [2, 3]]
    assert [lr["gpu"] for lr in d["learners"]] == [4, 5, 6, 7]
    assert d["transport"] == "nccl"
    expected = preflight(compose_run_config(["engine=vllm_tp2", "hardware=8xh100", "hardware.engine_gpus=4"]),
                         machine=False).plan
    prediction = d.pop("prediction")  # the planner's balance forecast rides along with the plan
    layouts = d.pop("layouts")  # and the hardware's layouts, fastest predicted first
    assert d == json.loads(expected.to_json())
    assert layouts[0]["step_s"] <= layouts[1]["step_s"] and sum(o["current"] for o in layouts) == 1
    assert d["layout_advice"].startswith(layouts[0]["label"] + " is predicted")
    assert prediction["available"] is True
    assert prediction["verdict"]["kind"] in ("generation_bound", "training_bound", "balanced")


def test_plan_vllm_on_cpu_fails_with_a_fix(tmp_path):
    proc, _ = rlgen("plan", "engine=vllm", "hardware=cpu", cwd=tmp_path)
    line = assert_clean_failure(proc)
    assert "engine=vllm needs CUDA GPUs" in line
    assert "engine=hf" in line
    assert proc.stdout == ""


def test_plan_tp4_on_2xh200_fails_with_a_fix(tmp_path):
    proc, _ = rlgen("plan", "engine=vllm_tp4", "hardware=2xh200", cwd=tmp_path)
    line = assert_clean_failure(proc)
    assert "tensor_parallel_size=4 is larger than a node (2 GPUs)" in line
    assert "use tensor_parallel_size <= 2" in line


def test_no_arguments_prints_usage_and_exits_2(tmp_path):
    proc, _ = rlgen(cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout.startswith("usage: rlgen <command>")
    assert "plan" in proc.stdout and "train" in proc.stdout


def test_unknown_command(tmp_path):
    proc, _ = rlgen("frobnicate", cwd=tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "unknown command 'frobnicate'" in proc.stderr
    assert "plan" in proc.stderr.split("unknown command", 1)[1]


def test_console_script_without_arguments(tmp_path):
    script = Path(sys.executable).with_name("rlgen")
    if not script.exists():
        pytest.skip(f"no console script next to {sys.executable}")
    proc = subprocess.run([str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout.startswith("usage: rlgen <command>")


# The rest run `main` in this process (cheaper than a fresh interpreter each).


@pytest.fixture
def cli(capsys, monkeypatch):
    from rlgen.cli import main

    monkeypatch.setenv("COLUMNS", "160")

    def run(*args: str) -> tuple[int, str, str]:
        rc = main(list(args))
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def test_plan_on_cpu_shows_cpu_actors(cli):
    rc, out, err = cli("plan")
    assert rc == 0, err
    assert table_rows(out) == {"engine0": ["hf", "0", "cpu", "1"], "learner0": ["torch", "0", "cpu", "-"]}
    assert "ray_object_store" in out


def test_plan_json_relative_path_before_the_overrides(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = cli("plan", "--json", "p.json", "hardware=2xh200", "engine=vllm")
    assert rc == 0, err
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["hardware"] == "2xh200" and d["engine_kind"] == "vllm"
    assert [lr["gpu"] for lr in d["learners"]] == [0, 1]  # the plan's layout: hybrid, a rank on each GPU


def test_plan_json_without_a_path(cli):
    rc, out, err = cli("plan", "--json")
    assert rc == 2
    assert err.strip() == "error: --json needs a file path, e.g. rlgen plan --json plan.json"


def test_plan_unknown_key_fails_with_one_line(cli):
    rc, out, err = cli("plan", "engine.max_modl_len=5")
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "engine.max_modl_len is not a setting of engine" in err


def test_plan_lists_every_problem(cli):
    rc, out, err = cli("plan", "algo.top_p=0", "algo.async_steps=-1")
    assert rc == 2
    lines = err.strip().splitlines()
    assert lines == ["error: 2 problems:", lines[1], lines[2]], err
    assert lines[1].startswith("- algo.top_p=0.0")
    assert lines[2].startswith("- algo.async_steps=-1")


def test_plan_rejects_multirun(cli):
    rc, out, err = cli("plan", "-m", "engine.num_engines=1,2")
    assert rc == 2
    assert "rlgen plan takes one config" in err


def test_help_prints_usage_and_exits_0(cli):
    rc, out, err = cli("--help")
    assert rc == 0
    assert out.startswith("usage: rlgen <command>")


def test_plan_with_a_number_for_a_group_fails_cleanly(cli):
    rc, out, err = cli("plan", "hardware=8")
    assert rc == 2
    assert "hardware" in err


@pytest.mark.parametrize(("overrides", "key"), [
    (["task=calculator", "task.max_turns=0"], "task.max_turns=0"),
    (["task=env"], "task.kind=env needs task.env="),
])
def test_an_episode_setting_the_plan_and_the_task_both_refuse_is_listed_once(overrides, key):
    # the plan's value checks and the task itself find the same problem: the report says it once
    problems = preflight(compose_run_config(overrides), machine=False).problems
    assert len([p for p in problems if p.startswith(key)]) == 1, problems
