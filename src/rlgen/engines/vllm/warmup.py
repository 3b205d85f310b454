"""What vLLM's kernel warm-up samples with (the engine actor's ``sampler_warmup``).

Before an engine reports ready, vLLM 0.26 runs a prefill and a decode of its largest batch with
``SamplingParams.for_sampler_warmup()``, which switches on every sampler feature: top-k and top-p, min-p, three
penalties, logit bias, bad words, five logprobs and prompt logprobs. On a host whose Triton cache is empty, each
of those compiles a kernel first; the top-k/top-p kernel alone takes seconds. Rollouts sample with a temperature,
a seed and the sampled token's logprob (``rlgen.types.SamplingParams.plain``), so a rollout engine's warm-up
samples the same way: the kernels its batches use compile before it is ready, and those they never use do not
compile at all. A request that asks for more (top-k, penalties) compiles its kernels when it first comes. A
server's engines (``rlgen serve``), whose requests may ask for anything, keep vLLM's own warm-up.

The warm-up runs in the engine-core process, which is forked from the actor, so the actor sets it before it
builds the engine; a core started by spawn imports vLLM afresh and keeps vLLM's warm-up. No vllm import at
module level."""

from __future__ import annotations

ROLLOUTS, ALL = "rollouts", "all"  # the sampling of rollouts; every feature (vLLM's own)


def set_sampler_warmup(kind: str) -> str:
    """Make vLLM's sampler warm-up sample as ``kind`` says; returns what it will sample with (ALL where vLLM
    offers no such hook, or kind is ALL)."""
    if kind != ROLLOUTS:
        return ALL
    from vllm.sampling_params import SamplingParams

    if not callable(getattr(SamplingParams, "for_sampler_warmup", None)):
        return ALL

    def like_rollouts() -> SamplingParams:
        return SamplingParams(temperature=1.0, seed=0, logprobs=0)

    SamplingParams.for_sampler_warmup = staticmethod(like_rollouts)
    return ROLLOUTS


__all__ = ["ALL", "ROLLOUTS", "set_sampler_warmup"]
