"""The layouts of one hardware, ranked by predicted step: every candidate is the user's config with only the layout
keys set, the first is the predicted-fastest of those that build, the plan runs it where the config names no
layout, and the advice names what to type for a faster one."""

from __future__ import annotations

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.plan.layouts import faster_layout_line, layout_options
from rlgen.plan.prediction import predict
from rlgen.plan.preflight import preflight


def options_of(*overrides):
    cfg = compose_run_config(list(overrides))
    return cfg, build_plan(cfg), layout_options(cfg, build_plan(cfg), build_plan)


@pytest.mark.parametrize("engine", ["vllm", "vllm_tp2"])
def test_the_ranking_puts_the_predicted_fastest_layout_first(engine):
    cfg, plan, options = options_of(f"engine={engine}", "hardware=4xh100", "model=qwen2_5_1_5b")
    built = [o for o in options if o.step_s is not None]
    assert [o.step_s for o in built] == sorted(o.step_s for o in built) and len(built) >= 4
    assert {o.label for o in options} >= {"hybrid, TP 1", "hybrid, TP 2", "split 2+2, TP 1", "split 2+2, TP 2"}
    assert [o.current for o in options].count(True) == 1  # the plan's own layout is among them, once
    # each option's prediction is that of the plan its overrides build, with everything else the user typed
    for o in built:
        again = build_plan(compose_run_config([f"engine={engine}", "hardware=4xh100", "model=qwen2_5_1_5b",
                                               *o.overrides]))
        assert predict(again).step_s == pytest.approx(o.step_s)
        assert again.config.model.name == plan.config.model.name
    refused = [o for o in options if o.step_s is None]
    assert all(o.why for o in refused)  # each with the plan's sentence (three learner ranks cannot split 512 rows)
    assert options[0].label == "hybrid, TP 1"  # every GPU trains and generates: 1.6x the split's tok/s measured


def test_the_advice_names_the_faster_layout_and_what_to_type_or_nothing_when_the_plan_is_fastest():
    _, _, options = options_of("engine=vllm_tp2", "hardware=4xh100", "model=qwen2_5_1_5b", "hardware.colocated=false")
    line = faster_layout_line(options)
    assert line.startswith("hybrid, TP 1 is predicted") and "than this plan's split 2+2, TP 2" in line
    assert line.endswith("add: hardware.colocated=true engine.tensor_parallel_size=1")
    _, _, best = options_of("engine=vllm", "hardware=4xh100", "hardware.colocated=true", "model=qwen2_5_1_5b")
    assert best[0].current and faster_layout_line(best) is None


def test_nothing_to_rank_on_cpu_or_one_gpu_and_the_plan_carries_the_advice():
    assert options_of("hardware=cpu")[2] == []
    assert options_of("engine=vllm", "hardware=1xh100")[2] == []
    report = preflight(compose_run_config(["engine=vllm_tp2", "hardware=4xh100", "model=qwen2_5_1_5b"]),
                       machine=False)
    assert report.plan.layout_advice.startswith("hybrid, TP 1 is predicted")
    assert preflight(compose_run_config([]), machine=False).plan.layout_advice == ""


def test_with_no_layout_named_the_plan_runs_the_predicted_fastest_at_the_engines_tp():
    for engine, tp in (("vllm", 1), ("vllm_tp2", 2)):
        cfg, plan, options = options_of(f"engine={engine}", "hardware=4xh100", "model=qwen2_5_1_5b")
        mine = [o for o in options if o.step_s is not None and o.label.endswith(f"TP {tp}")]
        assert mine[0].current  # the fastest predicted at the typed TP is the one the plan built
        assert predict(plan).step_s == pytest.approx(mine[0].step_s)
        (choice,) = [c for c in plan.choices if c.key == "layout"]
        assert choice.chosen == mine[0].label and choice.why.startswith("derived: the layout predicted fastest")
        said = {s.key: s for s in plan.settings}
        assert said["hardware.colocated"].source == choice.why
    # the 1.5B on four H100s: hybrid, every GPU both trains and generates
    assert options_of("engine=vllm", "hardware=4xh100", "model=qwen2_5_1_5b")[1].colocated


def test_a_layout_the_config_names_is_kept():
    split = build_plan(compose_run_config(["engine=vllm", "hardware=4xh100", "model=qwen2_5_1_5b",
                                           "hardware.colocated=false"]))
    assert not split.colocated and len(split.learners) + len({e.gpus for e in split.engines}) == 4
    one = build_plan(compose_run_config(["engine=vllm", "hardware=4xh100", "model=qwen2_5_1_5b",
                                         "hardware.learner_gpus=1"]))  # the engines take the rest
    assert not one.colocated and len(one.learners) == 1 and one.config.hardware.engine_gpus == 3
    assert not any(c.key == "layout" for c in one.choices)
    hybrid = build_plan(compose_run_config(["engine=vllm_tp2", "hardware=4xh100", "model=qwen2_5_1_5b",
                                            "hardware.colocated=true"]))
    assert hybrid.colocated and len(hybrid.learners) == 4 and {e.tensor_parallel_size for e in hybrid.engines} == {2}


def test_engines_without_a_prediction_get_half_the_gpus():
    plan = build_plan(compose_run_config(["engine=hf", "hardware=4xh100", "model=qwen2_5_0_5b"]))
    (choice,) = [c for c in plan.choices if c.key == "layout"]
    assert choice.chosen == "split 2+2, TP 1" and "engines get half the GPUs" in choice.why


def test_rlgen_plan_says_which_layout_it_picked_in_one_line():
    from rlgen.plan.view import choice_lines

    plan = build_plan(compose_run_config(["engine=vllm", "hardware=4xh100", "model=qwen2_5_1_5b"]))
    (line,) = [x for x in choice_lines(plan) if x.startswith("chosen: layout")]
    assert line == "chosen: layout hybrid, TP 1, predicted fastest of the 4 at this TP size (ranked below)"
