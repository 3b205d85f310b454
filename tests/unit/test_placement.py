"""plan_bundles: Plan -> placement-group bundles per node, and which bundle each actor takes."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan import LearnerSlot, Plan, build_plan
from rlgen.plan.placement import ActorPlacement, Placement, plan_bundles


@functools.cache
def plan_of(*overrides: str) -> Plan:
    # Geometry only, whichever learner would train the layout.
    return build_plan(compose_run_config(list(overrides)), runnable=False)


def bundles_of(*overrides: str) -> Placement:
    return plan_bundles(plan_of(*overrides))


def test_cpu():
    pl = bundles_of("hardware=cpu")
    assert pl.groups == (({"CPU": 1.0}, {"CPU": 1.0}),)
    assert pl.engines == (ActorPlacement(group=0, bundle=0, num_cpus=1.0, num_gpus=0.0),)
    assert pl.learners == (ActorPlacement(group=0, bundle=1, num_cpus=1.0, num_gpus=0.0),)


def test_cpu_with_two_learner_ranks():
    # The plan refuses several CPU learner ranks (only DeepSpeed trains with several), but placement itself
    # handles any number of CPU actors.
    plan = dataclasses.replace(plan_of("hardware=cpu"), learners=(LearnerSlot(0, 0, None), LearnerSlot(1, 0, None)))
    pl = plan_bundles(plan)
    assert pl.groups == (({"CPU": 1.0},) * 3,)
    assert [a.bundle for a in pl.learners] == [1, 2]


def test_one_h100_colocated_shares_one_gpu_bundle():
    pl = bundles_of("engine=vllm", "hardware=1xh100", "engine.engines_per_gpu=1")
    assert pl.groups == (({"CPU": 2.0, "GPU": 1.0},),)
    assert pl.engines == (ActorPlacement(0, 0, 1.0, 0.5),)
    assert pl.learners == (ActorPlacement(0, 0, 1.0, 0.5),)


def test_8xh100_tp2_engine_bundles_hold_two_gpus():
    pl = bundles_of("engine=vllm_tp2", "hardware=8xh100", "hardware.engine_gpus=4")
    assert len(pl.groups) == 1
    assert pl.groups[0] == ({"CPU": 2.0, "GPU": 2.0},) * 2 + ({"CPU": 1.0, "GPU": 1.0},) * 4
    assert pl.engines == (ActorPlacement(0, 0, 1.0, 2.0), ActorPlacement(0, 1, 1.0, 2.0))
    assert pl.learners == tuple(ActorPlacement(0, b, 1.0, 1.0) for b in range(2, 6))


def test_two_nodes_one_group_per_node():
    pl = bundles_of("engine=vllm_tp2", "hardware=2x8xh100", "hardware.engine_gpus=8")
    assert len(pl.groups) == 2
    assert pl.groups[0] == ({"CPU": 2.0, "GPU": 2.0},) * 4
    assert pl.groups[1] == ({"CPU": 1.0, "GPU": 1.0},) * 8
    assert pl.engines == tuple(ActorPlacement(0, b, 1.0, 2.0) for b in range(4))
    assert pl.learners == tuple(ActorPlacement(1, b, 1.0, 1.0) for b in range(8))
    assert [sum(b.get("GPU", 0) for b in g) for g in pl.groups] == [8.0, 8.0]


def test_colocated_tp_engine_sits_on_its_first_gpus_bundle():
    plan = plan_of("engine=vllm_tp2", "hardware=8xh100", "hardware.colocated=true")
    pl = plan_bundles(plan)
    assert pl.groups == (({"CPU": 2.0, "GPU": 1.0},) * 8,)
    assert [lr.bundle for lr in pl.learners] == list(range(8))
    assert [e.bundle for e in pl.engines] == [0, 2, 4, 6] == [e.gpus[0] for e in plan.engines]


LAYOUTS = [
    ("hardware=cpu",),
    ("engine=vllm", "hardware=1xh100"),
    ("engine=vllm", "hardware=2xh200"),
    ("engine=vllm_tp2", "hardware=8xh100"),
    ("engine=vllm_tp2", "hardware=8xh100", "engine.num_engines=1"),
    ("engine=vllm_tp4", "hardware=8xh200"),
    ("engine=vllm", "hardware=2x8xh100"),
    ("engine=vllm_tp2", "hardware=2x8xh100"),
    ("engine=vllm_tp2", "hardware=2x8xh100", "hardware.engine_gpus=12", "hardware.learner_gpus=4"),
    ("engine=vllm_tp2", "hardware=8xh100", "hardware.colocated=true"),
]


@pytest.mark.parametrize("overrides", LAYOUTS, ids=[" ".join(o) for o in LAYOUTS])
def test_bundles_fit_their_nodes_and_every_actor_fits_its_bundle(overrides):
    plan = plan_of(*overrides)
    pl = plan_bundles(plan)
    nodes = sorted({e.node for e in plan.engines} | {lr.node for lr in plan.learners})
    assert len(pl.groups) == len(nodes)
    assert len(pl.engines) == len(plan.engines) and len(pl.learners) == len(plan.learners)
    for g, group in enumerate(pl.groups):
        assert sum(b.get("GPU", 0.0) for b in group) <= plan.gpus_per_node, (
            f"group {g} asks more GPUs than a node has"
        )
    # what the actors sitting on each bundle ask for, added up, fits the bundle
    asked: dict[tuple[int, int], list[float]] = {}
    for a in pl.engines + pl.learners:
        assert 0 <= a.group < len(pl.groups) and 0 <= a.bundle < len(pl.groups[a.group])
        cpu, gpu = asked.setdefault((a.group, a.bundle), [0.0, 0.0])
        asked[(a.group, a.bundle)] = [cpu + a.num_cpus, gpu + a.num_gpus]
    for (g, b), (cpu, gpu) in asked.items():
        bundle = pl.groups[g][b]
        assert cpu <= bundle["CPU"] and gpu <= bundle.get("GPU", 0.0), (
            f"actors on bundle {g}/{b} overflow {bundle}"
        )
    assert set(asked) == {(g, b) for g, group in enumerate(pl.groups) for b in range(len(group))}, (
        "an unused bundle"
    )
    # every actor lands in its own node's group; separate engines and learners never share a bundle
    for e, a in zip(plan.engines, pl.engines):
        assert nodes[a.group] == e.node
    for lr, a in zip(plan.learners, pl.learners):
        assert nodes[a.group] == lr.node
    if not plan.colocated:
        places = [(a.group, a.bundle) for a in pl.engines + pl.learners]
        assert len(set(places)) == len(places)
        if plan.device == "cuda":
            assert [a.num_gpus for a in pl.engines] == [float(e.tensor_parallel_size) for e in plan.engines]
            total = sum(b.get("GPU", 0.0) for group in pl.groups for b in group)
            assert total == sum(len(e.gpus) for e in plan.engines) + len(plan.learners)
