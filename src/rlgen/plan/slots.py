"""Which node and GPUs each engine and each learner rank gets. Pure: no torch, no Ray. Problems go to ``p``, one
sentence each with its fix."""

from __future__ import annotations

import dataclasses

from rlgen.config import RunConfig
from rlgen.engines.registry import EngineSpec
from rlgen.plan.resolved import EngineSlot, Layout, LearnerSlot
from rlgen.plan.tensor_parallel import tp_problem


def shared_gpu_problem(cfg: RunConfig, spec: EngineSpec, layout: Layout) -> str | None:
    """Why engine.engines_per_gpu > 1 cannot run here, with the fix (None: it can, or it is 1)."""
    e, hw, k = cfg.engine, cfg.hardware, cfg.engine.engines_per_gpu
    if k in (None, 1):
        return None
    if not spec.memory_share or hw.gpus_per_node == 0:
        return (f"engine.engines_per_gpu={k} shares a GPU between engines that each take a part of its memory, and "
                f"engine={spec.kind} on hardware={hw.name} runs one engine per device; set engine.engines_per_gpu=1.")
    if e.tensor_parallel_size != 1:
        return (f"engine.engines_per_gpu={k} shares one GPU between engines, but engine.tensor_parallel_size="
                f"{e.tensor_parallel_size} spreads each engine over whole GPUs; set one of them to 1.")
    if layout is not Layout.colocated:
        return (f"engine.engines_per_gpu={k} needs engines colocated with the learner (hardware.colocated=true), "
                "where weights reach every engine on the GPU through CUDA IPC. Engines on their own GPUs take "
                "weights over NCCL, which cannot hold two engines of one GPU in one update; set "
                "hardware.colocated=true, or engine.engines_per_gpu=1.")
    return None


# Up to this size an engine's decode step is bound by its engine core's CPU work, not by the GPU, so a second
# engine on the GPU (its own engine core) raises generation throughput. Against one engine on one H100: 1.77x
# at 0.5B (the one-liner's batch), 1.17x and 1.50x at 1.5B (the bench workload, two hosts); docs/benchmarks.md.
SHARED_GPU_MAX_PARAMS = 2.0e9


def default_engines_per_gpu(cfg: RunConfig, spec: EngineSpec, layout: Layout, params: int) -> tuple[int, str]:
    """engine.engines_per_gpu when the config leaves it null, and why: 2 where engines may share a GPU (vLLM,
    TP 1, colocated), the model has at most SHARED_GPU_MAX_PARAMS parameters and engine.num_engines is left
    to the plan, else 1."""
    two = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, engines_per_gpu=2))
    if shared_gpu_problem(two, spec, layout):
        return 1, "derived: engines cannot share a GPU here"
    if params > SHARED_GPU_MAX_PARAMS:
        return 1, (f"derived: at {params / 1e9:.1f}B parameters the GPU, not an engine's CPU work, sets the "
                   "decode pace")
    if cfg.learner.lora.enabled:
        return 1, "derived: LoRA runs one engine per GPU"
    if cfg.engine.num_engines is not None:  # a count the user chose is a count of whole-GPU engines
        return 1, "derived: engine.num_engines is set"
    return 2, ("derived: up to 2B parameters an engine's CPU work, not the GPU, sets the decode pace, and a "
               "second engine core on the GPU generated 1.2-1.8x as fast (one H100)")


def place_engines(cfg: RunConfig, spec: EngineSpec, layout: Layout, p: list[str]) -> tuple[EngineSlot, ...]:
    e, hw = cfg.engine, cfg.hardware
    tp = e.tensor_parallel_size
    shared = shared_gpu_problem(cfg, spec, layout)
    if shared:
        p.append(shared)
        return ()
    if layout is Layout.served:
        # The server's engines, each spoken for by a small CPU actor beside the learners (rank 0's node).
        node = hw.nodes - 1 if hw.gpus_per_node == 0 else 0
        return tuple(EngineSlot(i, node, (), tp) for i in range(e.num_engines or 1))
    if hw.gpus_per_node == 0:
        return _cpu_engines(cfg, spec, p)
    if not spec.tensor_parallel and tp != 1:
        p.append(f"engine={spec.kind} does not shard across GPUs; set engine.tensor_parallel_size=1 or use "
                 f"engine=vllm_tp{tp}.")
        return ()
    engine_gpus = hw.nodes * hw.gpus_per_node if layout is Layout.colocated else hw.engine_gpus
    if not _tp_fits(cfg, engine_gpus, p):
        return ()
    slots = _fill_nodes(cfg, engine_gpus, p)
    if slots is None:
        return ()
    return _take(cfg, slots, engine_gpus, p)


def _cpu_engines(cfg: RunConfig, spec: EngineSpec, p: list[str]) -> tuple[EngineSlot, ...]:
    e, hw = cfg.engine, cfg.hardware
    if not spec.runs_on("cpu"):
        p.append(f"engine={spec.kind} needs CUDA GPUs, but hardware={hw.name} has none; use engine=hf on CPU, or "
                 "choose GPU hardware such as hardware=1xh100.")
        return ()
    if e.tensor_parallel_size != 1:
        p.append(f"engine.tensor_parallel_size={e.tensor_parallel_size} needs GPUs; on hardware={hw.name} set it to 1.")
        return ()
    # Several CPU nodes: engines on all but the last node, round-robin; the learner takes the last one.
    engine_nodes = max(1, hw.nodes - 1)
    return tuple(EngineSlot(i, i % engine_nodes, (), 1) for i in range(e.num_engines or 1))


def _tp_fits(cfg: RunConfig, engine_gpus: int, p: list[str]) -> bool:
    hw, tp = cfg.hardware, cfg.engine.tensor_parallel_size
    if engine_gpus < 1:
        p.append(f"hardware.engine_gpus={engine_gpus}: engines need at least one GPU; set hardware.engine_gpus.")
    elif tp > hw.gpus_per_node:
        p.append(f"engine.tensor_parallel_size={tp} is larger than a node ({hw.gpus_per_node} GPUs) and a TP group "
                 f"never spans nodes; use tensor_parallel_size <= {hw.gpus_per_node}.")
    elif engine_gpus % tp:
        p.append(f"engine.tensor_parallel_size={tp} does not divide the {engine_gpus} engine GPUs of hardware="
                 f"{hw.name}; choose a TP size that divides {engine_gpus}, or change hardware.engine_gpus.")
    elif problem := tp_problem(cfg.model, tp, hw.gpus_per_node):
        p.append(problem)
    else:
        return True
    return False


def _fill_nodes(cfg: RunConfig, engine_gpus: int, p: list[str]) -> list[EngineSlot] | None:
    """Engines fill nodes from node 0; each node's engine share must hold whole TP groups."""
    hw, tp, k = cfg.hardware, cfg.engine.tensor_parallel_size, cfg.engine.engines_per_gpu
    slots: list[EngineSlot] = []
    remaining = engine_gpus
    for node in range(hw.nodes):
        here = min(remaining, hw.gpus_per_node)
        if here % tp:
            p.append(f"node {node} would hold {here} engine GPUs, which is not a whole number of TP-{tp} groups, and "
                     f"a TP group never spans nodes; make hardware.engine_gpus a multiple of {tp} on every node "
                     f"(e.g. {tp * (hw.gpus_per_node // tp)}).")
            return None
        for g in range(0, here, tp):
            for _ in range(k):  # engines sharing a GPU sit next to each other
                slots.append(EngineSlot(len(slots), node, tuple(range(g, g + tp)), tp, per_gpu=k))
        remaining -= here
        if remaining == 0:
            break
    return slots


def _take(cfg: RunConfig, slots: list[EngineSlot], engine_gpus: int, p: list[str]) -> tuple[EngineSlot, ...]:
    """The first engine.num_engines slots (all when it is null)."""
    e, hw, tp = cfg.engine, cfg.hardware, cfg.engine.tensor_parallel_size
    want = e.num_engines
    if want is None:
        return tuple(slots)
    if want > len(slots) and e.engines_per_gpu > 1:
        p.append(f"engine.num_engines={want} is more than the {len(slots)} engines that {engine_gpus} GPU(s) hold at "
                 f"engine.engines_per_gpu={e.engines_per_gpu} on hardware={hw.name}; set engine.num_engines<="
                 f"{len(slots)}, or raise engine.engines_per_gpu.")
        return ()
    if want > len(slots):
        p.append(f"engine.num_engines={want} with tensor_parallel_size={tp} needs {want * tp} GPUs, but only "
                 f"{engine_gpus} are for engines on hardware={hw.name}; set engine.num_engines<={len(slots)} or raise "
                 "hardware.engine_gpus.")
        return ()
    return tuple(slots[:want])


def place_learners(cfg: RunConfig, layout: Layout, p: list[str]) -> tuple[LearnerSlot, ...]:
    hw = cfg.hardware
    if hw.gpus_per_node == 0:
        if hw.learner_ranks < 1:
            p.append(f"hardware.learner_ranks={hw.learner_ranks} must be at least 1.")
            return ()
        return tuple(LearnerSlot(r, hw.nodes - 1, None) for r in range(hw.learner_ranks))
    total = hw.nodes * hw.gpus_per_node
    if layout in (Layout.colocated, Layout.served):  # a server's engines leave every GPU to the learners
        return tuple(LearnerSlot(r, r // hw.gpus_per_node, r % hw.gpus_per_node) for r in range(total))
    if hw.learner_gpus < 1:
        p.append(f"hardware.learner_gpus={hw.learner_gpus}: learners need at least one GPU; set hardware.learner_gpus.")
        return ()
    start = hw.engine_gpus
    return tuple(LearnerSlot(r, (start + r) // hw.gpus_per_node, (start + r) % hw.gpus_per_node)
                 for r in range(hw.learner_gpus))


__all__ = ["place_engines", "place_learners", "shared_gpu_problem"]
