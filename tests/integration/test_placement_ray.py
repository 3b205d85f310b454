"""The bundles of a two-node plan, handed to a real (local, two-raylet) Ray cluster, land one group per node."""

from __future__ import annotations

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.plan.placement import plan_bundles

ray = pytest.importorskip("ray")

OVERRIDES = ["engine=vllm_tp2", "hardware=2x8xh100", "hardware.engine_gpus=8"]  # the split: engines fill node 0
# Fake resources per node. plan_bundles asks 8 CPUs on each node of this plan (4 TP-2 engine bundles of 2 CPUs;
# 8 learner bundles of 1), so each fake node gets exactly 8 CPUs and 8 GPUs: a group then fills a node.
NODE_CPUS = 8
NODE_GPUS = 8
READY_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def ray_cluster(request):
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={
            "num_cpus": NODE_CPUS,
            "num_gpus": NODE_GPUS,
            "include_dashboard": False,
            # no actors run here: skip starting idle Python workers (saves CPU on a small machine)
            "_system_config": {"enable_worker_prestart": False, "prestart_worker_first_driver": False},
        },
    )

    def stop():
        ray.shutdown()
        cluster.shutdown()

    request.addfinalizer(stop)
    cluster.add_node(num_cpus=NODE_CPUS, num_gpus=NODE_GPUS)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def test_one_strict_pack_group_per_node(ray_cluster):
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    placement = plan_bundles(build_plan(compose_run_config(OVERRIDES)))
    assert len(placement.groups) == 2
    for group in placement.groups:  # the fake nodes are sized for this plan
        assert sum(b["CPU"] for b in group) <= NODE_CPUS and sum(b["GPU"] for b in group) <= NODE_GPUS

    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(alive) == 2

    pgs = [placement_group(list(bundles), strategy="STRICT_PACK") for bundles in placement.groups]
    try:
        for i, pg in enumerate(pgs):
            assert pg.wait(timeout_seconds=READY_TIMEOUT_S), (
                f"placement group {i} not ready in {READY_TIMEOUT_S} s"
            )
        tables = [placement_group_table(pg) for pg in pgs]
        group_nodes = []
        for i, (table, bundles) in enumerate(zip(tables, placement.groups)):
            assert table["state"] == "CREATED"
            assert table["strategy"] == "STRICT_PACK"
            assert table["bundles"] == dict(enumerate(bundles))
            nodes = set(table["bundles_to_node_id"].values())
            assert len(table["bundles_to_node_id"]) == len(bundles)
            assert len(nodes) == 1, f"group {i} is spread over nodes {nodes}"
            group_nodes.append(nodes.pop())
        assert group_nodes[0] != group_nodes[1], "both groups landed on the same node"
        assert set(group_nodes) == alive
    finally:
        for pg in pgs:
            remove_placement_group(pg)


def test_the_two_node_cluster_holds_the_plan_and_a_bigger_plan_fails_at_once(ray_cluster):
    from rlgen.runtime.cluster.nodes import assign_nodes, cluster_nodes
    from rlgen.runtime.errors import RunError

    nodes = cluster_nodes()
    assert len(set(assign_nodes(plan_bundles(build_plan(compose_run_config(OVERRIDES))), nodes))) == 2
    bigger = plan_bundles(build_plan(compose_run_config(["engine=vllm", "hardware=8xh100",
                                                         "hardware.gpus_per_node=16", "hardware.engine_gpus=8",
                                                         "hardware.learner_gpus=8"])))
    with pytest.raises(RunError, match=r"needs 1 separate node\(s\) \(node 0: 16 GPUs and 16 CPUs\)"):
        assign_nodes(bigger, nodes)
    three_nodes = plan_bundles(build_plan(compose_run_config(["engine=vllm", "hardware=2x8xh100", "hardware.nodes=3",
                                                              "hardware.engine_gpus=8", "hardware.learner_gpus=16"])))
    with pytest.raises(RunError, match=r"needs 3 separate node\(s\)"):
        assign_nodes(three_nodes, nodes)
