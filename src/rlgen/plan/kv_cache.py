"""engine.kv_cache_gib: each engine's KV cache, sized from the batch it generates where engines share a GPU.

vLLM sizes its KV cache from the GPU memory it finds free while it profiles, so an engine that measures must start
alone on its GPU (rlgen.gpustart), and the engines and learner ranks that share the GPU start one after another.
Where the plan can say how much cache an engine can use, that wait is not needed: round-robin groups give each
engine at most ceil(prompts / engines) x samples sequences of at most the longest sequence's tokens, and cache
beyond that holds nothing a step reads again (each step's prompts are new, and the prefix cache is salted by
policy version). The plan gives the engine twice that (a re-sent shard of a restarted engine, a partial block per
sequence) when it fits well inside the engine's share; vLLM then takes that size without measuring, and every
engine and learner on the GPU starts at once. Pure: no torch, no vllm."""

from __future__ import annotations

import math

from rlgen.config import RunConfig, Setting, set_key
from rlgen.engines.registry import EngineSpec
from rlgen.plan.memory import ENGINE_HEADROOM_GIB, GIB, engine_floor_gib
from rlgen.plan.resolved import BatchGeometry, EngineSlot, ModelSummary
from rlgen.plan.tensor_parallel import kv_groups

BLOCK_TOKENS = 16  # vLLM's KV block: a sequence holds whole blocks
ROOM = 2  # the cache covers this many times the engine's share of a step's sequences
FIT = 0.75  # at most this part of what the engine's share leaves after its weights and headroom (an estimate)


def engine_sequences(cfg: RunConfig, batch: BatchGeometry, engines: int) -> int:
    """The most sequences one engine generates at once: its round-robin share of the step's groups, at most
    engine.max_num_seqs."""
    groups = math.ceil(batch.prompts_per_step / max(engines, 1))
    return min(cfg.engine.max_num_seqs, groups * batch.samples_per_prompt)


def kv_gib(tokens: int, model: ModelSummary, parts: int) -> float:
    """The KV cache of `tokens` tokens on each GPU of an engine whose KV heads split `parts` ways (kv_groups), GiB."""
    return tokens * model.kv_bytes_per_token / max(parts, 1) / GIB


def share_left_gib(cfg: RunConfig, model: ModelSummary, share: float) -> float:
    """What an engine's memory share leaves for its KV cache on each of its GPUs, by the plan's estimate: the share
    less the engine's part of the bf16 weights and its headroom (activations, CUDA graphs, the sampler)."""
    weights, _ = engine_floor_gib(cfg, model.weight_gib_bf16, model.kv_bytes_per_token)
    return cfg.hardware.gpu.memory_gb * 1e9 / GIB * share - weights - ENGINE_HEADROOM_GIB


def size_kv_cache(cfg: RunConfig, spec: EngineSpec, model: ModelSummary, batch: BatchGeometry,
                  engines: tuple[EngineSlot, ...]) -> tuple[RunConfig, list[Setting]]:
    """cfg with engine.kv_cache_gib filled where the config leaves it null, the engines share their GPUs (with
    learner ranks or with each other) and twice their share of the batch fits FIT of what their memory share
    leaves; else unchanged (vLLM measures, alone on the GPU)."""
    e = cfg.engine
    if e.kv_cache_gib is not None:
        return cfg, [Setting("engine.kv_cache_gib", e.kv_cache_gib, "config")]
    if not (spec.memory_share and cfg.hardware.gpus_per_node and engines and e.gpu_memory_utilization):
        return cfg, []
    shared = bool(cfg.hardware.colocated) or any(s.per_gpu > 1 for s in engines)
    if not shared:
        return cfg, []
    per_gpu = max(s.per_gpu for s in engines)
    share = e.gpu_memory_utilization / per_gpu
    seqs = engine_sequences(cfg, batch, len(engines))
    blocks = math.ceil(batch.max_seq_len / BLOCK_TOKENS)
    kv_parts = kv_groups(cfg.model.num_kv_heads, e.tensor_parallel_size)
    want = kv_gib(ROOM * seqs * blocks * BLOCK_TOKENS, model, kv_parts)
    _, one_sequence = engine_floor_gib(cfg, model.weight_gib_bf16, model.kv_bytes_per_token)  # vLLM's least
    want = math.ceil(max(want, one_sequence) * 100) / 100
    if want > FIT * share_left_gib(cfg, model, share):
        return cfg, []
    why = (f"derived: {ROOM} x the {seqs} sequences of up to {batch.max_seq_len} tokens each engine generates a "
           "step, so engines sharing a GPU start side by side (vLLM does not measure)")
    return set_key(cfg, "engine.kv_cache_gib", want), [Setting("engine.kv_cache_gib", want, why)]


__all__ = ["engine_sequences", "kv_gib", "share_left_gib", "size_kv_cache"]
