"""A run past the preset's positions (Ray on CPU): the plan extends the tiny preset's 128 positions with YaRN, the
built folder carries it, and the hf engine and the torch learner, both reading that folder, agree on every
sampled token's logprob out to the far positions."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime.run import run_training

pytestmark = pytest.mark.usefixtures("module_ray")


def test_a_run_past_the_presets_positions_trains_with_yarn_on_both_sides(tmp_path):
    plan = build_plan(compose_run_config([
        "progress=false", "steps=2", "algo.prompts_per_step=4", "algo.async_steps=0", "checkpoint.every=0",
        "algo.max_new_tokens=200", "task.max_prompt_tokens=16", "model.warm_start_steps=0",  # never stops early
    ]))
    assert plan.config.model.yarn_factor == 2.0 and plan.config.engine.max_model_len == 216
    run_training(plan, tmp_path, Console(quiet=True))
    folder = json.loads((tmp_path / "final_model" / "config.json").read_text())
    assert folder["rope_parameters"]["rope_type"] == "yarn" and folder["rope_parameters"]["factor"] == 2.0
    steps = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(steps) == 2
    for s in steps:
        assert s["response_len_max"] > 128 - 16  # responses run past the 128 base positions
        assert s["mismatch/k3_kl"] < 1e-9 and s["mismatch/max_abs_delta"] < 1e-4
