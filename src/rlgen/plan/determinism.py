"""A deterministic run (``deterministic=true``, docs/correctness.md "Deterministic runs"): what the plan turns on
for it. vLLM engines get ``VLLM_BATCH_INVARIANT=1`` in their environment (a prompt's tokens and logprobs then do
not depend on what else is in its batch); the learners take torch's deterministic algorithms (``deterministic``
of their constructors, rlgen.learners.policy.deterministic_algorithms); completions enter a step's batch in a
fixed order whatever order they arrived in (rlgen.runtime.rollouts.batch). The hf engine on CPU is deterministic
as it is.

vLLM 0.26's batch-invariant kernels hold for engine steps of up to 255 sequences: on one H200, 64 prompts sampled
inside a batch of 512 gave other tokens for 3 of them where the engine ran all 512 at once, and the same tokens
and logprobs, bit for bit, where it ran at most 255 (tests/gpu/test_batch_invariance.py; vLLM's fused residual
RMSNorm picks its block size by the step's row count, below and from 256: vllm-project/vllm#48271). So a
deterministic plan caps engine.max_num_seqs at INVARIANT_SEATS."""

from __future__ import annotations

import dataclasses

from rlgen.config import RunConfig
from rlgen.engines.registry import EngineSpec

BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"
# cards vLLM documented its batch-invariant kernels for (compute capability 9.0 and later), by GPUSpec name
DOCUMENTED = ("H100", "H200", "B100", "B200")
INVARIANT_SEATS = 255  # the most sequences a vLLM engine step holds and stays batch-invariant (above)


def resolve_determinism(cfg: RunConfig, spec: EngineSpec) -> tuple[RunConfig, list[str]]:
    """cfg with the engines' environment for a deterministic run, and the plan's warnings about it."""
    if not cfg.deterministic or not spec.passes_env:
        return cfg, []
    if spec.served:  # its engines run already, in the server's environment
        return cfg, ["deterministic=true: a running server's engines are batch-invariant only if it was started so "
                     "(rlgen serve deterministic=true); the learners here take their deterministic algorithms."]
    env = {**cfg.engine.env, BATCH_INVARIANT: "1"}
    seats = min(cfg.engine.max_num_seqs, INVARIANT_SEATS)
    cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, env=env, max_num_seqs=seats))
    card = cfg.hardware.gpu.name
    if cfg.hardware.gpus_per_node and not card.startswith(DOCUMENTED):
        return cfg, [f"deterministic=true: vLLM documented its batch-invariant kernels for compute capability 9.0 "
                     f"and later (H100, H200, B100, B200); on {card} its engines may refuse to start or not be "
                     "batch-invariant."]
    return cfg, []


def determinism_line(cfg: RunConfig, spec: EngineSpec) -> str:
    """What deterministic means for this plan, and what it costs."""
    if not cfg.deterministic:
        return "off (deterministic=true: one seed gives the same tokens, logprobs and metrics)"
    engines = (f"vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1) on at most {cfg.engine.max_num_seqs} "
               "sequences an engine step (engine.max_num_seqs)" if spec.passes_env and not spec.served else
               f"engine={spec.kind} as it is")
    return (f"on: {engines}, the learners' deterministic algorithms, completions in a fixed order; without the cap "
            "on sequences it cost 13% of tokens/s on one H200 (the 0.5B; docs/benchmarks.md), with it not measured yet")


__all__ = ["BATCH_INVARIANT", "INVARIANT_SEATS", "determinism_line", "resolve_determinism"]
