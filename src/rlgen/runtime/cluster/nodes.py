"""The Ray cluster against the plan: which Ray node holds each plan node, chosen before anything is placed.

Each plan node's bundles form one placement group pinned to one Ray node (its ``ray.io/node-id`` label), and
no two plan nodes share a Ray node, so "engines on node 0, learners on node 1" holds on any cluster. When no
assignment exists, one sentence says what the plan needs and what the cluster has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlgen.runtime.errors import RunError

if TYPE_CHECKING:
    from rlgen.plan.placement import Placement

NODE_ID_LABEL = "ray.io/node-id"


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    cpus: float
    gpus: float
    alive: bool = True

    def describe(self) -> str:
        return f"{self.address} ({self.node_id[:8]}: {self.gpus:g} GPUs, {self.cpus:g} CPUs)"


def cluster_nodes() -> list[NodeInfo]:
    """The alive nodes of the connected cluster, with what they have in all."""
    import ray

    return [
        NodeInfo(n["NodeID"], n.get("NodeManagerAddress", "?"), n["Resources"].get("CPU", 0.0),
                 n["Resources"].get("GPU", 0.0), bool(n["Alive"]))
        for n in ray.nodes() if n.get("Alive")
    ]


def node_alive(node_id: str) -> bool:
    import ray

    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def group_demand(group: tuple[dict[str, float], ...]) -> tuple[float, float]:
    """(CPUs, GPUs) that a plan node's bundles ask for together."""
    return sum(b.get("CPU", 0.0) for b in group), sum(b.get("GPU", 0.0) for b in group)


def assign_nodes(placement: Placement, nodes: list[NodeInfo], where: str = "the cluster") -> list[str]:
    """A distinct Ray node for each plan node (placement group), largest demand first, each on the smallest
    node that holds it. Raises RunError naming what is missing."""
    demands = [group_demand(g) for g in placement.groups]
    order = sorted(range(len(demands)), key=lambda i: (-demands[i][1], -demands[i][0]))
    free = sorted(nodes, key=lambda n: (n.gpus, n.cpus))
    chosen: dict[int, str] = {}
    for i in order:
        cpus, gpus = demands[i]
        fit = next((n for n in free if n.gpus >= gpus and n.cpus >= cpus), None)
        if fit is None:
            break
        chosen[i] = fit.node_id
        free.remove(fit)
    if len(chosen) == len(demands):
        return [chosen[i] for i in range(len(demands))]
    need = "; ".join(f"node {i}: {g:g} GPUs and {c:g} CPUs" for i, (c, g) in enumerate(demands))
    have = ", ".join(n.describe() for n in nodes) or "no alive node"
    raise RunError(
        f"the Ray cluster at {where} cannot hold the plan: it needs {len(demands)} separate node(s) ({need}), but "
        f"has {have}; add nodes with those resources, or choose hardware=<preset> that fits the cluster."
    )


def node_name(node_id: str) -> str:
    """A node by its address and id prefix, also one that has left the cluster (Ray keeps its record)."""
    import ray

    address = next((n.get("NodeManagerAddress", "?") for n in ray.nodes() if n["NodeID"] == node_id), "?")
    return f"{address} ({node_id[:8]})"


def fits(bundle: dict[str, float], free: dict[str, float]) -> bool:
    return all(free.get(k, 0.0) >= v for k, v in bundle.items() if v > 0)


def spare_nodes(bundle: dict[str, float], free: dict[str, dict[str, float]], held: set[str],
                gone: set[str]) -> list[str]:
    """The alive nodes whose unreserved resources (free: node -> resources) hold ``bundle``, nodes that hold
    none of the plan's groups (held) first, then the smallest; never one of ``gone``."""
    fit = [n for n, r in free.items() if n not in gone and fits(bundle, r)]
    return sorted(fit, key=lambda n: (n in held, free[n].get("GPU", 0.0), free[n].get("CPU", 0.0)))


def free_per_node() -> dict[str, dict[str, float]]:
    """What each alive node has left that no placement group or actor holds."""
    from ray._private.state import available_resources_per_node  # DeveloperAPI: per node, not summed

    alive = {n.node_id for n in cluster_nodes()}
    return {n: dict(r) for n, r in available_resources_per_node().items() if n in alive}
