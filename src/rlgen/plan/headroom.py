"""What a plan's hardware leaves room for, so the balancer's advice names only changes this hardware can take:
GPUs no actor uses, one more engine per GPU where engines may share one, whether engines run ahead of the learner
here (algo.async_steps=1), and, for its "with more GPUs" clause, the hardware presets that have more GPUs. Pure:
no torch, no Ray."""

from __future__ import annotations

import dataclasses
import re

from rlgen.config import RunConfig
from rlgen.config.compose import group_options
from rlgen.engines.registry import EngineSpec
from rlgen.plan.overlap import runs_ahead
from rlgen.plan.resolved import EngineSlot, Layout, LearnerSlot, ModelSummary
from rlgen.plan.slots import shared_gpu_problem

ADVISED_ENGINES_PER_GPU = 2


def preset_gpus(name: str) -> tuple[int, str] | None:
    """(GPUs in all, GPU kind) of a hardware preset named like 8xh100 or 2x8xh100; None for CPU presets."""
    m = re.fullmatch(r"((?:\d+x)+)([a-z]\w*)", name)
    if not m or "cpu" in m.group(2):
        return None
    total = 1
    for n in m.group(1).rstrip("x").split("x"):
        total *= int(n)
    return total, m.group(2)


def bigger_hardware(cfg: RunConfig) -> list[tuple[str, int]]:
    """The hardware presets with more GPUs than cfg's, fewest first (of equal counts, those of cfg's GPU kind
    first)."""

    hw = cfg.hardware
    have = hw.nodes * hw.gpus_per_node
    kind = (preset_gpus(hw.name) or (0, ""))[1]
    found = [(name, g) for name in group_options("hardware") if (g := preset_gpus(name)) and g[0] > have]
    found.sort(key=lambda x: (x[1][0], x[1][1] != kind))
    return [(name, g[0]) for name, g in found]


def hardware_room(cfg: RunConfig, spec: EngineSpec, layout: Layout, engines: tuple[EngineSlot, ...],
                  learners: tuple[LearnerSlot, ...], ms: ModelSummary) -> dict:
    """{free_gpus, learner_gpus and engine_gpus (learner_gpus 0 when they share the engines' GPUs),
    engines_per_gpu_next (None: engines cannot share a GPU more), runs_ahead (engines run ahead of the learner
    here by default: plan.overlap), hybrid (engines on GPUs of their own could share every GPU with a learner rank
    instead: hardware.colocated=true), bigger_hardware: [(name, gpus), ...]} for the balancer
    (rlgen.metrics.balance.BalanceContext)."""
    from rlgen.plan.checks.spanning import check_engine_floor

    hw = cfg.hardware
    total = hw.nodes * hw.gpus_per_node
    engine_gpus = {(e.node, g) for e in engines for g in e.gpus}
    learner_gpus = {(r.node, r.gpu) for r in learners if r.gpu is not None}
    k = cfg.engine.engines_per_gpu
    # the KV-cache size is the plan's for k engines; with k + 1 it sizes them again
    more = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, engines_per_gpu=k + 1, kv_cache_gib=None))
    p: list[str] = []
    # three engines on one GPU generated slower than two (0.5B, one H100: docs/benchmarks.md), so advice stops at 2
    fits = bool(total) and k + 1 <= ADVISED_ENGINES_PER_GPU and not shared_gpu_problem(more, spec, layout)
    if fits:
        check_engine_floor(more, spec, ms, p)
    return {"free_gpus": max(total - len(engine_gpus | learner_gpus), 0),
            "learner_gpus": 0 if layout is Layout.colocated else len(learner_gpus), "engine_gpus": len(engine_gpus),
            "engines_per_gpu_next": k + 1 if fits and not p else None, "runs_ahead": runs_ahead(cfg, spec),
            "hybrid": layout is Layout.split and bool(spec.memory_share),
            "bigger_hardware": bigger_hardware(cfg) if total else []}


__all__ = ["bigger_hardware", "hardware_room", "preset_gpus"]
