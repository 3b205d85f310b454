"""engine.engines_per_gpu: several colocated vLLM engines on one GPU. The plan places them in the learner's
bundle, splits the engines' memory share between them, and refuses the
layouts where they cannot run, with the fix."""

from __future__ import annotations

import re

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan import PlanError, build_plan
from rlgen.plan.memory import ENGINE_PROCESS_GIB
from rlgen.plan.placement import ActorPlacement, plan_bundles
from rlgen.plan.prediction import predict
from rlgen.plan.view import choice_lines, memory_line

ONE_GPU = ["engine=vllm", "hardware=1xh100", "model=qwen2_5_0_5b"]


def plan_of(*overrides: str):
    return build_plan(compose_run_config([*ONE_GPU, *overrides]))


def settings(plan) -> dict:
    return {s.key: (s.value, s.source) for s in plan.settings}


def test_two_engines_share_the_learners_gpu_and_its_bundle():
    plan = plan_of("engine.engines_per_gpu=2")
    assert plan.colocated and [(e.node, e.gpus) for e in plan.engines] == [(0, (0,)), (0, (0,))]
    pl = plan_bundles(plan)
    assert pl.groups == (({"CPU": 3.0, "GPU": 1.0},),)  # a CPU for the learner and for each engine
    # the learner holds half the GPU, the two engines a quarter each, all in the learner's bundle
    assert pl.learners == (ActorPlacement(0, 0, 1.0, 0.5),)
    assert pl.engines == (ActorPlacement(0, 0, 1.0, 0.25, 2),) * 2
    assert sum(a.num_gpus for a in (*pl.engines, *pl.learners)) == 1.0


def test_num_engines_caps_the_engines_on_a_gpu():
    plan = plan_of("engine.engines_per_gpu=3", "engine.num_engines=2")
    assert len(plan.engines) == 2
    assert [a.per_gpu for a in plan_bundles(plan).engines] == [2, 2]  # those placed split the share
    with pytest.raises(PlanError) as err:
        plan_of("engine.engines_per_gpu=3", "engine.num_engines=4")
    assert "engine.num_engines=4 is more than the 3 engines that 1 GPU(s) hold" in str(err.value)


def test_the_engines_share_is_split_and_the_extra_processes_are_counted():
    one, two = plan_of("engine.engines_per_gpu=1"), plan_of("engine.engines_per_gpu=2")
    m1, m2 = one.memory, two.memory
    assert (m1.engines_per_gpu, m2.engines_per_gpu) == (1, 2)
    assert m2.engine_awake and m2.learner_peak_gib == m1.learner_peak_gib
    # the second engine process holds ENGINE_PROCESS_GIB outside the share: the derived share leaves room for it
    # (it is no larger, and smaller where the 0.05 steps it is rounded down to tell them apart)
    assert m2.engine_fraction <= m1.engine_fraction
    assert m2.engine_fraction * m2.gpu_gib + ENGINE_PROCESS_GIB + m2.learner_peak_gib <= 0.85 * m2.gpu_gib
    why = settings(two)["engine.gpu_memory_utilization"][1]
    assert f"split between 2 engines, {m2.engine_fraction / 2:.3f} each" in why
    assert "split between 2 engines" in memory_line(two)


def test_a_given_share_must_hold_every_engine():
    # 0.5B: about 1 GiB of weights plus one 576-token sequence and headroom per engine, so 0.05 of an H100 (4 GiB)
    # holds one engine but not four
    assert plan_of("engine.gpu_memory_utilization=0.05", "engine.max_model_len=576").engines
    with pytest.raises(PlanError) as err:
        plan_of("engine.gpu_memory_utilization=0.05", "engine.max_model_len=576", "engine.engines_per_gpu=4")
    assert "/ 4 engines per GPU" in str(err.value) and "lower engine.engines_per_gpu" in str(err.value)


@pytest.mark.parametrize(("overrides", "text"), [
    (["engine=hf", "hardware=cpu", "engine.engines_per_gpu=2"],
     "engine=hf on hardware=cpu runs one engine per device; set engine.engines_per_gpu=1"),
    (["engine=vllm", "hardware=2xh200", "engine.engines_per_gpu=2", "hardware.colocated=false"],
     "needs engines colocated with the learner (hardware.colocated=true)"),
    (["engine=vllm_tp2", "hardware=2xh200", "hardware.colocated=true", "engine.engines_per_gpu=2"],
     "engine.tensor_parallel_size=2 spreads each engine over whole GPUs; set one of them to 1"),
    (["engine=vllm", "hardware=1xh100", "engine.engines_per_gpu=0"], "engine.engines_per_gpu=0 must be at least 1"),
])
def test_refusals_say_how_to_fix(overrides, text):
    with pytest.raises(PlanError) as err:
        build_plan(compose_run_config(overrides))
    assert any(text in p for p in err.value.problems), err.value.problems


@pytest.mark.parametrize(("overrides", "sentence"), [
    # 100 sleeping engines keep 200 GiB of an 80 GB GPU: one refusal naming the setting, never a negative figure
    (["engine.engines_per_gpu=100"],
     "engine.engines_per_gpu=100 puts 100 engines on each 80 GB GPU, which keep about 200 GiB of it while the "
     "learner trains (asleep), more than the 69 GiB that engines and learner may use together; lower "
     "engine.engines_per_gpu (1 or 2 is usual; left out, the plan picks)."),
    (["engine.engines_per_gpu=100", "algo.async_steps=1"], "engine.engines_per_gpu=100 puts 100 engines on each"),
    # an engine that stays awake with 0.9 of the GPU leaves the training learner nothing of the 85% both may use
    (["engine.gpu_memory_utilization=0.9", "algo.async_steps=1"],
     "engine.gpu_memory_utilization=0.9 keeps about 67 GiB of each 80 GB GPU while the learner trains, the engine "
     "staying awake (algo.async_steps=1), more than the 63 GiB that engine and learner may use together; set "
     "algo.async_steps=0 (the engine sleeps while the learner trains), or lower engine.gpu_memory_utilization."),
])
def test_engines_that_leave_the_learner_nothing_are_refused_without_a_negative_figure(overrides, sentence):
    with pytest.raises(PlanError) as err:
        plan_of(*overrides)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(sentence), err.value.problems
    assert not re.search(r"-\d", err.value.problems[0])  # no negative figure


def test_the_prediction_draws_engines_on_one_gpu_as_one():
    one, two = predict(plan_of("engine.engines_per_gpu=1")), predict(plan_of("engine.engines_per_gpu=2"))
    assert one.available and two.available and two.num_engines == 1
    assert two.gen_s == pytest.approx(one.gen_s, rel=0.1)  # the same GPU share, drawn as one engine
    assert any("2 engines share 1 GPU(s)" in n for n in two.notes)


def test_left_null_the_plan_runs_two_engines_per_gpu_for_small_models_where_they_may_share_it():
    plan = plan_of()  # the 0.5B one-liner as typed
    assert [e.per_gpu for e in plan.engines] == [2, 2] and plan.config.engine.engines_per_gpu == 2
    value, why = settings(plan)["engine.engines_per_gpu"]
    assert value == 2 and why.startswith("derived: up to 2B parameters")
    assert plan.memory.engines_per_gpu == 2
    big = build_plan(compose_run_config(["engine=vllm", "hardware=1xh100", "model=qwen2_5_7b"]))
    assert len(big.engines) == 1 and settings(big)["engine.engines_per_gpu"][1].startswith("derived: at 7.6B")
    split = build_plan(compose_run_config(["engine=vllm", "hardware=2xh200", "model=qwen2_5_0_5b", "hardware.colocated=false"]))
    assert settings(split)["engine.engines_per_gpu"] == (1, "derived: engines cannot share a GPU here")
    cpu = build_plan(compose_run_config([]))  # the embedded default: hf engines on CPU
    assert cpu.config.engine.engines_per_gpu == 1
    counted = plan_of("engine.num_engines=1")  # one engine asked for: a whole one, not half of a shared GPU
    assert [e.per_gpu for e in counted.engines] == [1]
    assert settings(counted)["engine.engines_per_gpu"] == (1, "derived: engine.num_engines is set")
    given = plan_of("engine.engines_per_gpu=1")
    assert len(given.engines) == 1 and "engine.engines_per_gpu" not in settings(given)


def test_left_null_one_engine_per_gpu_when_two_do_not_fit_beside_the_learner():
    # a share given for the engines that two engine processes cannot split (each needs its weights and KV)
    plan = plan_of("engine.gpu_memory_utilization=0.03")
    assert plan.config.engine.engines_per_gpu == 1
    assert settings(plan)["engine.engines_per_gpu"][1].startswith("derived: 2 engines per GPU do not fit")
    # the choice is explicit: both candidates, and the problem that ruled out two, are on the plan and shown
    (choice,) = plan.choices
    assert choice.key == "engine.engines_per_gpu" and choice.chosen == 1
    assert [value for value, _ in choice.tried] == [2, 1]
    assert "engine.gpu_memory_utilization" in choice.tried[0][1] and choice.tried[1][1] == ""
    (line,) = choice_lines(plan)
    assert line.startswith("chosen: engine.engines_per_gpu=1 of [2, 1] (engine.engines_per_gpu=2 ruled out: ")
    assert plan.to_dict()["choices"][0]["tried"][0][0] == 2
    # where the first candidate builds, the choice has one entry and `rlgen plan` adds no line for it
    assert [c.tried for c in plan_of().choices] == [((2, ""),)] and choice_lines(plan_of()) == []
