"""The configs of rlgen's tools beside training: `rlgen bench`, `rlgen validate` and `rlgen serve` (re-exported by
rlgen.config.schema, whose RunConfig holds them). Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


@dataclass
class BenchConfig:
    """`rlgen bench`: an RL-shaped generation workload run on several engines side by side."""

    num_prompts: int = 256
    samples_per_prompt: int = 8
    prompt_len: int = 128
    response_len_median: int = 256  # per-request max_tokens ~ lognormal, clipped to [min, max]
    response_len_sigma: float = 1.0
    response_len_min: int = 16
    response_len_max: int = 2048
    engines: list[str] = field(default_factory=lambda: ["vllm", "hf", "vllm_raw"])
    # rlgen engine actors sharing one GPU in the vllm side (1/k of it and of the memory share each); at small
    # models vLLM's step is bound by its engine core's CPU work, and k engine cores keep the GPU busier.
    # null: as the plan derives engine.engines_per_gpu (2 for vLLM at TP 1 up to 2B parameters, else 1)
    engines_per_gpu: int | None = None
    hf_batch_size: int = 256
    seed: int = 0


class Perturb(StrEnum):
    none = "none"
    bfloat16 = "bfloat16"
    float16 = "float16"
    float8_e4m3fn = "float8_e4m3fn"
    float8_e5m2 = "float8_e5m2"


class Runner(StrEnum):
    auto = "auto"  # a Ray actor for vllm, this process for hf
    ray = "ray"
    local = "local"


@dataclass
class ValidateConfig:
    """`rlgen validate`: hypothesis-drawn cases comparing an engine with the hf reference."""

    cases: int = 24  # hypothesis examples; each is one batch of requests
    max_requests: int = 4  # requests per case
    max_prompt_tokens: int = 12
    max_new_tokens: int = 8
    max_n: int = 3  # samples per request
    length: int = 0  # > 0: every prompt this many tokens less max_new_tokens (numerics at a length)
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.7, 1.0, 1.3])  # 0 is greedy
    kl_tolerance: float = 1e-3  # per row: k3 KL(candidate || reference) at most this
    min_greedy_agreement: float = 0.9  # fraction of greedy sequences that agree
    tie_tolerance: float = 0.05  # a greedy divergence where the reference's logprobs differ by <= this is a tie
    perturb: Perturb = Perturb.float8_e5m2  # engine=hf: round the candidate's weights to this format
    reference_dtype: str = "float32"
    gpu_memory_utilization: float = 0.5  # cap for the candidate, which shares the GPU with the reference
    runner: Runner = Runner.auto
    seed: int = 0


@dataclass
class ServeConfig:
    """`rlgen serve`: engines from the engine, model and hardware groups behind HTTP."""

    host: str = "127.0.0.1"  # anything but loopback needs a token
    port: int = 8000
    data_parallel: int = 1  # engines, each of TP engine.tensor_parallel_size
    token: str | None = None  # bearer token clients must send; RLGEN_SERVE_TOKEN when null
    max_sequences: int = 4096  # per request: prompts x n
    max_body_mb: float = 64.0  # a generation request's body; weight updates have no limit
    request_timeout_s: float = 600.0  # a generation call waits at most this long on the engines
    max_queue: int = 256  # generation requests waiting or running at once; more get 429 with Retry-After
    body_timeout_s: float = 30.0  # a request body that stalls this long gets 408
    header_timeout_s: float = 30.0  # a request's headers not whole after this long get 408


__all__ = ["BenchConfig", "Perturb", "Runner", "ServeConfig", "ValidateConfig"]
