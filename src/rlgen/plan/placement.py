"""Plan -> Ray placement-group bundles. Pure: the mapping is testable without Ray."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rlgen.plan.resolved import EngineSlot, Layout, Plan


@dataclass(frozen=True)
class ActorPlacement:
    group: int  # which placement group (one per node, STRICT_PACK, so a node's actors stay together)
    bundle: int  # bundle index inside that group
    num_cpus: float
    num_gpus: float
    per_gpu: int = 1  # engines sharing this engine's GPU (engine.engines_per_gpu), this one included


@dataclass(frozen=True)
class Placement:
    groups: tuple[tuple[dict[str, float], ...], ...]  # per node: its bundles
    engines: tuple[ActorPlacement, ...]
    learners: tuple[ActorPlacement, ...]


def plan_bundles(plan: Plan) -> Placement:
    nodes = sorted({e.node for e in plan.engines} | {lr.node for lr in plan.learners})
    group_of = {node: i for i, node in enumerate(nodes)}
    bundles: list[list[dict[str, float]]] = [[] for _ in nodes]
    engines: list[ActorPlacement] = []
    learners: list[ActorPlacement] = []

    own = plan.engines  # engines this run starts on its own hardware
    if plan.layout is Layout.served:  # engines live on the server: a small CPU actor each speaks for one
        own = ()
        for e in plan.engines:
            g = group_of[e.node]
            bundles[g].append({"CPU": 0.5})
            engines.append(ActorPlacement(g, len(bundles[g]) - 1, 0.5, 0.0))
    if plan.device == "cpu":
        for e in own:
            g = group_of[e.node]
            bundles[g].append({"CPU": 1.0})
            engines.append(ActorPlacement(g, len(bundles[g]) - 1, 1.0, 0.0))
        for lr in plan.learners:
            g = group_of[lr.node]
            bundles[g].append({"CPU": 1.0})
            learners.append(ActorPlacement(g, len(bundles[g]) - 1, 1.0, 0.0))
    elif plan.colocated:
        # One bundle per GPU, held by the learner rank there. TP-1 engines share their GPU's bundle and ask
        # for half the GPU between them; a TP>1 engine is pinned to its first GPU's bundle and asks for none,
        # since vLLM starts its own per-GPU workers.
        sharing = Counter((e.node, e.gpus[0]) for e in plan.engines)
        gpu_bundle: dict[tuple[int, int], tuple[int, int]] = {}
        for lr in plan.learners:
            g = group_of[lr.node]
            # a CPU for the learner and one for each engine pinned here (one at least)
            bundles[g].append({"CPU": 1.0 + max(1, sharing[(lr.node, lr.gpu)]), "GPU": 1.0})
            gpu_bundle[(lr.node, lr.gpu)] = (g, len(bundles[g]) - 1)
            learners.append(ActorPlacement(g, len(bundles[g]) - 1, 1.0, 0.5))
        for e in plan.engines:
            g, b = gpu_bundle[(e.node, e.gpus[0])]
            k = sharing[(e.node, e.gpus[0])]
            engines.append(ActorPlacement(g, b, 1.0, 0.5 / k if e.tensor_parallel_size == 1 else 0.0, k))
    else:
        for e in own:
            g = group_of[e.node]
            tp = float(e.tensor_parallel_size)
            bundles[g].append({"CPU": tp, "GPU": tp})
            # The actor holds all its TP GPUs, so Ray narrows CUDA_VISIBLE_DEVICES to them and vLLM's
            # own per-GPU workers start inside that set.
            engines.append(ActorPlacement(g, len(bundles[g]) - 1, 1.0, tp))
        for lr in plan.learners:
            g = group_of[lr.node]
            bundles[g].append({"CPU": 1.0, "GPU": 1.0})
            learners.append(ActorPlacement(g, len(bundles[g]) - 1, 1.0, 1.0))
    return Placement(tuple(tuple(b) for b in bundles), tuple(engines), tuple(learners))


def gpu_group(e: EngineSlot) -> tuple:
    """What engines on the same GPU(s) have in common; engines without GPUs (CPU, remote) share nothing."""
    return (e.node, e.gpus) if e.gpus else ("alone", e.index)

