"""engine=vllm: vLLM's AsyncLLM in a Ray actor (``engine.VLLMEngine``) on CUDA GPUs. It shards over GPUs (tensor
parallelism), takes a share of its GPU's memory that the plan sizes, sleeps while colocated learners train or
stays awake and takes weight updates while it generates, and receives weights over NCCL (own GPUs) or CUDA IPC
(colocated), or holds the base and takes LoRA adapters. Its other modules: args (engine arguments), loop (its
event loop), updates (how weights get in; what its workers run is rlgen.sync.receiver), adapters (LoRA), stream
(streamed generation), common (its error and timeouts), startup (why it could not start), kvcache (the KV size
kept for the next start), fork (how its engine core starts), modelinfo (vLLM's inspection of the model class,
begun at launch). ``before_model_folder`` is what an engine asked for before its model folder is built does
meanwhile: it imports vLLM."""

from __future__ import annotations

from typing import Any

from rlgen.config import RunConfig, Transport
from rlgen.engines.registry import EngineSpec
from rlgen.engines.vllm.args import VLLM_DEFAULT_SHARE, engine_args_for


def _transport(colocated: bool, cfg: RunConfig) -> Transport:
    return Transport.cuda_ipc if colocated else Transport.nccl


def _actor_kwargs(cfg: RunConfig, transport: Transport, env: dict[str, str]) -> dict[str, Any]:
    return {"env": dict(env), "engine_args": engine_args_for(transport, engine_lora_rank(cfg, transport))}


def engine_lora_rank(cfg: RunConfig, transport: Transport) -> int:
    """The largest adapter rank the engines make room for: engine.max_lora_rank when set, else the learner's rank
    when it sends adapters, else 0 (no LoRA)."""
    if cfg.engine.max_lora_rank is not None:
        return int(cfg.engine.max_lora_rank)
    return int(cfg.learner.lora.rank or 0) if transport is Transport.lora_adapter else 0


def _ahead(architectures: list[str], env: dict[str, str]) -> None:
    from rlgen.engines.vllm.modelinfo import start_inspection

    start_inspection(architectures, env)


def before_model_folder(env: dict[str, str] | None) -> str:
    """What an engine asked for before its model folder exists does meanwhile (rlgen.runtime.start.early_engines):
    the first step of its start, vLLM's import with the engine's environment (startup.prepare_process). Its own
    start then finds vLLM imported. Returns the name of the step, as the engine's start-up clock names it."""
    from rlgen.engines.vllm.startup import prepare_process

    prepare_process(env)
    return "import vllm"


ENGINE = EngineSpec(
    kind="vllm",
    actor="rlgen.engines.vllm.engine:VLLMEngine",
    starting="a vLLM engine imports, loads its weights, compiles, sizes its KV cache and captures CUDA graphs",
    devices=("cuda",),
    package="vllm",
    tensor_parallel=True,
    memory_share=True,
    default_memory_share=VLLM_DEFAULT_SHARE,
    sleeps=True,
    keeps_warm=True,
    shuts_down=True,
    in_flight_updates=True,
    receives_nccl=True,
    receives_ipc=True,
    threaded=True,
    passes_env=True,
    adapters=True,
    adapter_room=True,
    episodes=True,
    cuts_short=True,
    transport=_transport,
    actor_kwargs=_actor_kwargs,
    ahead=_ahead,
)
