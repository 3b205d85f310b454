"""task.response_length_mean gives random weights RL-shaped lengths with random stop ids: refused on a
warm-started preset (whose trained answers it would cut), a warning with model.path (which may be trained),
allowed on random presets; a mean at or above the response cap is refused, and `rlgen plan` prints the mean the
cap leaves."""

from __future__ import annotations

import pytest

from rlgen.cli import main as cli_main
from rlgen.config.compose import compose_run_config
from rlgen.plan import PlanError, build_plan
from rlgen.plan.lengths import shaped_mean
from rlgen.plan.preflight import preflight

RANDOM_GPU = ["engine=vllm", "hardware=1xh200", "model=qwen2_5_0_5b", "algo.max_new_tokens=2048"]
WARNING = "adds random stop ids that cut a trained model's answers short"


def _problems(*overrides: str) -> list[str]:
    with pytest.raises(PlanError) as err:
        build_plan(compose_run_config(list(overrides)))
    return err.value.problems


@pytest.mark.parametrize("model, steps", [("tiny", 200), ("small", 150)])
def test_a_warm_started_preset_refuses_the_random_stop_ids(model, steps):
    [problem] = _problems(f"model={model}", "algo.max_new_tokens=64", "task.response_length_mean=16")
    assert problem == (f"task.response_length_mean=16 adds random stop ids, meant for random weights, but model "
                       f"{model} is warm-started (model.warm_start_steps={steps}), so they would cut its trained "
                       "answers short; set model.warm_start_steps=0 for random weights, or drop "
                       "task.response_length_mean.")


def test_random_weights_keep_the_random_stop_ids():
    build_plan(compose_run_config([*RANDOM_GPU, "task.response_length_mean=256"]))
    build_plan(compose_run_config(["model.warm_start_steps=0", "algo.max_new_tokens=64",
                                   "task.response_length_mean=16"]))
    assert preflight(compose_run_config([*RANDOM_GPU, "task.response_length_mean=256"]), machine=False).notes == []


def test_a_model_folder_gets_a_warning_not_a_refusal(local_model):
    folder = [f"model.path={local_model / 'model'}", "task.max_prompt_tokens=64", "algo.max_new_tokens=64"]
    cfg = compose_run_config([*folder, "task.response_length_mean=16"])
    report = preflight(cfg, machine=False)
    assert report.problems == []
    [note] = [n for n in report.notes if WARNING in n]
    assert note.startswith(f"task.response_length_mean=16 {WARNING}")
    assert f"model.path={local_model / 'model'}" in note and "meant for random-weight models" in note
    quiet = preflight(compose_run_config(folder), machine=False)
    assert not [n for n in quiet.notes if WARNING in n]


def test_a_mean_at_or_above_the_cap_is_refused():
    for mean in (4, 1000):
        [problem] = _problems("model.warm_start_steps=0", "algo.max_new_tokens=4", f"task.response_length_mean={mean}")
        assert problem == (f"task.response_length_mean={mean} is not below the response cap algo.max_new_tokens=4, "
                           "so every response would run to the cap; set task.response_length_mean below 4, or raise "
                           "algo.max_new_tokens.")
    build_plan(compose_run_config(["model.warm_start_steps=0", "algo.max_new_tokens=4", "task.response_length_mean=3"]))


def test_plan_prints_the_mean_the_cap_leaves(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the step table's row on one line
    assert cli_main(["plan", *RANDOM_GPU[:3], "algo.max_new_tokens=300", "task.response_length_mean=256"]) == 0
    out = capsys.readouterr().out
    left = shaped_mean(256, 300)
    assert 176 < left < 178
    assert f"RL-shaped: about {left:.0f} on average" in out and "about 256 on average" not in out
