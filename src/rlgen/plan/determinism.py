"""A deterministic run (``deterministic=true``, docs/correctness.md "Deterministic runs"): what the plan turns on
for it. vLLM engines get ``VLLM_BATCH_INVARIANT=1`` in their environment (a prompt's tokens and logprobs then do
not depend on what else is in its batch); the learners take torch's deterministic algorithms (``deterministic``
of their constructors, rlgen.learners.policy.deterministic_algorithms); completions enter a step's batch in a
fixed order whatever order they arrived in (rlgen.runtime.rollouts.batch). The hf engine on CPU is deterministic
as it is.

vLLM 0.26's batch-invariant kernels hold for engine steps of up to 255 sequences: on one H200, 64 prompts sampled
inside a batch of 512 gave other tokens for 3 of them where the engine ran all 512 at once, and the same tokens
and logprobs, bit for bit, where it ran at most 255 (tests/gpu/test_batch_invariance.py; vLLM's fused residual
RMSNorm picks its block size by the step's row count, below and from 256: vllm-project/vllm#48271). A step's rows
are its tokens, a prefill's and the decodes' together, and which prompts an engine admits beside which decodes
depends on when their requests arrived. So a deterministic plan caps both engine.max_num_seqs and
engine.max_num_batched_tokens at INVARIANT_SEATS: every engine step then stays below the switch."""

from __future__ import annotations

import dataclasses

from rlgen.config import RunConfig
from rlgen.engines.registry import EngineSpec

BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"
# cards vLLM documented its batch-invariant kernels for (compute capability 9.0 and later), by GPUSpec name
DOCUMENTED = ("H100", "H200", "B100", "B200")
INVARIANT_SEATS = 255  # the most rows (tokens) a vLLM engine step holds and stays batch-invariant (above)


def resolve_determinism(cfg: RunConfig, spec: EngineSpec) -> tuple[RunConfig, list[str]]:
    """cfg with the engines' environment for a deterministic run, and the plan's warnings about it."""
    if not cfg.deterministic or not spec.passes_env:
        return cfg, []
    if spec.served:  # its engines run already, in the server's environment
        return cfg, ["deterministic=true: a running server's engines are batch-invariant only if it was started so "
                     "(rlgen serve deterministic=true); the learners here take their deterministic algorithms."]
    env = {**cfg.engine.env, BATCH_INVARIANT: "1"}
    seats = min(cfg.engine.max_num_seqs, INVARIANT_SEATS)
    rows = min(cfg.engine.max_num_batched_tokens or INVARIANT_SEATS, INVARIANT_SEATS)
    cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, env=env, max_num_seqs=seats,
                                                              max_num_batched_tokens=rows))
    card = cfg.hardware.gpu.name
    if cfg.hardware.gpus_per_node and not card.startswith(DOCUMENTED):
        return cfg, [f"deterministic=true: vLLM documented its batch-invariant kernels for compute capability 9.0 "
                     f"and later (H100, H200, B100, B200); on {card} its engines may refuse to start or not be "
                     "batch-invariant."]
    return cfg, []


def determinism_problems(cfg: RunConfig, p: list[str]) -> None:
    """What a deterministic run cannot hold: partial rollouts cut a flight where its groups are done, and which
    groups are done by then depends on timing."""
    if cfg.deterministic and cfg.algo.partial_rollouts > 0:
        p.append(f"deterministic=true with algo.partial_rollouts={cfg.algo.partial_rollouts:g}: a flight is cut "
                 "short where enough of its groups are done, and which are done by then depends on timing, so two "
                 "runs would part; set algo.partial_rollouts=0 or drop deterministic=true.")


def determinism_line(cfg: RunConfig, spec: EngineSpec) -> str:
    """What deterministic means for this plan, and what it costs."""
    if not cfg.deterministic:
        return "off (deterministic=true: one seed gives the same tokens, logprobs and metrics)"
    engines = (f"vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1) on at most {cfg.engine.max_num_seqs} "
               f"sequences and {cfg.engine.max_num_batched_tokens} tokens an engine step (engine.max_num_seqs, "
               "engine.max_num_batched_tokens)" if spec.passes_env and not spec.served else
               f"engine={spec.kind} as it is")
    return (f"on: {engines}, the learners' deterministic algorithms, completions in a fixed order, weights that "
            "change between flights only (an update waits for the flights ahead to finish); it cost 18% of tokens/s on "
            "one H200 (the 0.5B, 240 sequences an engine a step; docs/benchmarks.md)")


__all__ = ["BATCH_INVARIANT", "INVARIANT_SEATS", "determinism_line", "determinism_problems", "resolve_determinism"]
