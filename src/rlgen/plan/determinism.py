"""A deterministic run (``deterministic=true``, docs/correctness.md "Deterministic runs"): what the plan turns on
for it. vLLM engines get ``VLLM_BATCH_INVARIANT=1`` in their environment (a prompt's tokens and logprobs then do
not depend on what else is in its batch); the learners take torch's deterministic algorithms (``deterministic``
of their constructors, rlgen.learners.policy.deterministic_algorithms); completions enter a step's batch in a
fixed order whatever order they arrived in (rlgen.runtime.rollouts.batch). The hf engine on CPU is deterministic
as it is."""

from __future__ import annotations

import dataclasses

from rlgen.config import RunConfig
from rlgen.engines.registry import EngineSpec

BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"
# cards vLLM documented its batch-invariant kernels for (compute capability 9.0 and later), by GPUSpec name
DOCUMENTED = ("H100", "H200", "B100", "B200")


def resolve_determinism(cfg: RunConfig, spec: EngineSpec) -> tuple[RunConfig, list[str]]:
    """cfg with the engines' environment for a deterministic run, and the plan's warnings about it."""
    if not cfg.deterministic or not spec.passes_env:
        return cfg, []
    if spec.served:  # its engines run already, in the server's environment
        return cfg, ["deterministic=true: a running server's engines are batch-invariant only if it was started so "
                     "(rlgen serve deterministic=true); the learners here take their deterministic algorithms."]
    env = {**cfg.engine.env, BATCH_INVARIANT: "1"}
    cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, env=env))
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
    engines = ("vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1)" if spec.passes_env else
               f"engine={spec.kind} as it is")
    return (f"on: {engines}, the learners' deterministic algorithms, completions in a fixed order; its cost in "
            "tokens/s is not measured yet")


__all__ = ["BATCH_INVARIANT", "determinism_line", "resolve_determinism"]
