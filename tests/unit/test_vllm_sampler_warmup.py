"""rlgen.engines.vllm.warmup: a rollout engine's vLLM warm-up samples as rollouts do (a temperature, a seed, the
sampled token's logprob); a server's keeps vLLM's, which switches on every sampler feature. vLLM itself is not
needed: a stand-in vllm.sampling_params with vLLM 0.26's hook."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

from rlgen.engines.vllm import warmup


@dataclass
class StandInParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    repetition_penalty: float = 1.0

    @staticmethod
    def for_sampler_warmup() -> StandInParams:  # vLLM 0.26's: every feature on
        return StandInParams(temperature=0.9, top_p=0.9, top_k=50, min_p=0.1, logprobs=5, prompt_logprobs=1,
                             repetition_penalty=1.2)


@pytest.fixture
def vllm_stand_in(monkeypatch):
    pkg, mod = types.ModuleType("vllm"), types.ModuleType("vllm.sampling_params")
    cls = type("SamplingParams", (StandInParams,), {})
    mod.SamplingParams = cls
    pkg.sampling_params = mod
    monkeypatch.setitem(sys.modules, "vllm", pkg)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", mod)
    return cls


def test_a_rollout_engine_warms_up_only_what_rollouts_sample_with(vllm_stand_in):
    assert warmup.set_sampler_warmup(warmup.ROLLOUTS) == warmup.ROLLOUTS
    p = vllm_stand_in.for_sampler_warmup()
    assert (p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.prompt_logprobs) == (0, 1.0, 0.0, 1.0, None)
    assert p.temperature == 1.0 and p.seed is not None and p.logprobs == 0  # seeded, the sampled token's logprob


def test_a_servers_engine_keeps_vllms_warm_up(vllm_stand_in):
    assert warmup.set_sampler_warmup(warmup.ALL) == warmup.ALL
    assert vllm_stand_in.for_sampler_warmup().top_k == 50


def test_a_vllm_without_the_hook_keeps_its_own(vllm_stand_in, monkeypatch):
    monkeypatch.delattr(StandInParams, "for_sampler_warmup")
    assert warmup.set_sampler_warmup(warmup.ROLLOUTS) == warmup.ALL
