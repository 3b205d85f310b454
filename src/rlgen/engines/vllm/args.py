"""What the vllm engine is built and sampled with: the environment its processes need, the AsyncEngineArgs
for an EngineConfig and the per-request sampling seed. Importing this module imports no vllm or torch."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlgen.config import EngineConfig
from rlgen.rope import context_positions

VLLM_DEFAULT_SHARE = 0.9  # vLLM's own gpu_memory_utilization: an engine alone on its GPUs

# Settings the engine process starts with unless engine.env says otherwise. update_weights() hands vLLM a
# function and tensors to run on its workers; vLLM 0.26 only serialises those with insecure (pickle)
# serialisation on. The engine core is forked where that is safe (rlgen.engines.vllm.fork), and torch looks for
# the GPU through NVML, so the actor's own checks leave CUDA uninitialized for the forked child.
REQUIRED_ENV: dict[str, str] = {
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
    "VLLM_WORKER_MULTIPROC_METHOD": "fork",
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
}

# Engine arguments rlgen sets on top of EngineConfig unless the caller overrides them (``engine_args``).
# AsyncEngineArgs alone would budget 2048 tokens per step; 16384 is what vllm.LLM picks on GPUs of 70 GB or
# more. On the bench workload (128-token prompts) the two measured the same; the larger budget is kept for
# longer prompts. Measurements: docs/benchmarks.md.
TUNED_DEFAULTS: dict[str, Any] = {
    "max_num_batched_tokens": 16384,
}
VLLM_MAX_LOGPROBS = 20  # vLLM's max_logprobs when unset: the most logprobs per position a request may ask for


def model_context_length(model_path: str) -> int | None:
    """The positions a model folder's config.json holds (max_position_embeddings, times its YaRN factor), or
    None when it does not say."""

    path = Path(model_path) / "config.json"
    if not path.is_file():
        return None
    hf = json.loads(path.read_text())
    return context_positions(hf) if isinstance(hf, dict) else None


def build_engine_args(
    model_path: str, engine: EngineConfig, seed: int = 0, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The keyword arguments of vLLM's AsyncEngineArgs for this config. No vllm import.

    engine.max_model_len is an upper bound: a model with a shorter context (the tiny preset has 128
    positions) gets its own, since vLLM refuses a longer one. The plan has already checked that a prompt plus
    its response fits the model's context."""
    context = model_context_length(model_path)
    args: dict[str, Any] = {
        "model": model_path,
        "skip_tokenizer_init": True,
        "tensor_parallel_size": engine.tensor_parallel_size,
        # null outside a plan (rlgen bench): vLLM's own default, for an engine alone on its GPUs
        "gpu_memory_utilization": (engine.gpu_memory_utilization if engine.gpu_memory_utilization is not None
                                   else VLLM_DEFAULT_SHARE),
        "enable_prefix_caching": engine.enable_prefix_caching,
        "max_model_len": min(engine.max_model_len, context) if context else engine.max_model_len,
        "max_num_seqs": engine.max_num_seqs,
        "enforce_eager": engine.enforce_eager,
        "dtype": engine.dtype or "auto",  # null outside a plan: the folder's own
        "seed": seed,
        "enable_sleep_mode": engine.enable_sleep_mode,
        "disable_log_stats": True,
        # Logprobs after temperature scaling, the quantity the learner recomputes as log_softmax(logits / T)
        # (vLLM's default, raw_logprobs, is taken before temperature).
        "logprobs_mode": "processed_logprobs",
    }
    if engine.kv_cache_gib:  # the plan's size (or the config's): vLLM takes it without measuring
        args["kv_cache_memory_bytes"] = int(engine.kv_cache_gib * 2**30)
    if not engine.torch_compile and not engine.enforce_eager:
        # vLLM's piecewise CUDA graphs need its compiled model; full graphs of decode steps do not
        args["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    if engine.tensor_parallel_size > 1:
        # The engine actor already holds its TP GPUs (one placement-group bundle), so vLLM's own worker
        # processes use them. Left to itself, vLLM sees the Ray placement group and picks its Ray executor,
        # whose engine core then fails to read that group's bundles (KeyError: 'bundles', vLLM 0.26, ray 2.60).
        args["distributed_executor_backend"] = "mp"
    args.update(TUNED_DEFAULTS)
    if engine.max_num_batched_tokens:
        args["max_num_batched_tokens"] = engine.max_num_batched_tokens
    args.update(dict(overrides or {}))
    return args


def mix_seed(seed: int | None, group_id: int) -> int | None:
    """A request's sampling seed: the step seed mixed with the prompt's group id, so prompts that share one
    step seed draw independent noise. vLLM then gives sample j of the request seed + j."""
    if seed is None:
        return None
    return (int(seed) * 1_000_003 + int(group_id) * 7919) % (2**31 - 1)


__all__ = ["REQUIRED_ENV", "TUNED_DEFAULTS", "VLLM_MAX_LOGPROBS", "build_engine_args", "mix_seed"]


# vLLM's LoRA kernels take these ranks; an adapter of another rank gets the next one up
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_room(rank: int) -> int:
    """The max_lora_rank vLLM is built with for adapters of rank ``rank``: the next rank its kernels take."""
    return next((r for r in LORA_RANKS if r >= int(rank)), LORA_RANKS[-1])


def engine_args_for(transport: str, lora_rank: int | None = None) -> dict[str, Any]:
    """Extra vLLM engine arguments a weight transport needs (VLLMEngine's ``engine_args``), and room for LoRA
    adapters up to ``lora_rank`` when it is set: two on the GPU (requests of an old policy version finish while
    the new one starts) and four on the CPU."""
    args: dict[str, Any] = {}
    if lora_rank:
        args.update(enable_lora=True, max_lora_rank=lora_rank_room(lora_rank), max_loras=2, max_cpu_loras=4)
    backend = {"nccl": "nccl", "cuda_ipc": "ipc"}.get(str(transport))
    if backend:
        args["weight_transfer_config"] = {"backend": backend}
    return args
