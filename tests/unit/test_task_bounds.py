"""The presets of multi-turn environments leave the task's token bounds null, and the plan fits them to the
model: they run as typed on the CPU default, a model with room keeps the large bounds, and a value set wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.plan.preflight import preflight

ENVS = Path(__file__).resolve().parents[1] / "envs"


@pytest.fixture
def rows(tmp_path, monkeypatch) -> Path:
    monkeypatch.syspath_prepend(str(ENVS))
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "3+4=", "answer": "7"}\n{"prompt": "1+2=", "answer": "3"}\n')
    return path


def test_an_environment_preset_runs_as_typed_on_the_default_model(rows):
    cfg = compose_run_config(["task=env", "task.env=episode_envs:EchoEnv", f"task.path={rows}"])
    report = preflight(cfg, machine=False)
    assert report.blocking(machine=False) == []
    t = report.plan.config.task
    assert (t.max_prompt_tokens, t.max_total_tokens) == (25, 103)  # a fifth of the 128 positions, and the rest
    shown = {s.key: s.source for s in report.plan.settings}
    assert "max_position_embeddings=128" in shown["task.max_total_tokens"]


def test_a_model_with_room_keeps_the_large_bounds_and_a_value_set_wins():
    from rlgen.plan.task_bounds import fill_task_bounds, fitted_bounds

    big = fill_task_bounds(compose_run_config(["task=env", "task.env=chain", "model=qwen2_5_0_5b"]))[0].task
    assert (big.max_prompt_tokens, big.max_total_tokens) == (64, 256)
    assert fitted_bounds(128, None, 40) == (64, 40) and fitted_bounds(128, 100, None) == (100, 28)
    assert fitted_bounds(128, None, 300) == (25, 300)  # refused by the length check, which names what fits
    assert fitted_bounds(96, None, None) == (19, 77)
    shorter = fill_task_bounds(compose_run_config(["task=env", "task.env=chain", "model=qwen2_5_0_5b",
                                                   "engine.max_model_len=100"]))[0].task
    assert shorter.max_prompt_tokens + shorter.max_total_tokens == 100
    cfg = build_plan(compose_run_config(["task=env", "task.env=chain", "task.max_prompt_tokens=8"])).config
    assert (cfg.task.max_prompt_tokens, cfg.task.max_total_tokens) == (8, 120)
