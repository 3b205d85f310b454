"""A vLLM engine that cannot start says why in one sentence: vLLM 0.26's own messages, as its engine core
prints them, are matched; a GPU with too little free memory is caught before vLLM starts."""

from __future__ import annotations

import sys
import types

import pytest

from rlgen.engines.vllm.startup import EngineStartError, check_free_memory, explain
from rlgen.runtime.errors import actor_death_detail

CORE = "(VLLMEngine pid=7) (EngineCore pid=9) "
CASES = [
    (
        CORE + "ValueError: Free memory on device cuda:0 (60.12/79.18 GiB) on startup is less than desired GPU "
        "memory utilization (0.9, 71.26 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
        "processes.",
        ["only 60.1 of the GPU's 79.2 GiB were free", "71.3 GiB that engine.gpu_memory_utilization=0.9 asks for",
         "leave engine.gpu_memory_utilization unset", "set it to 0.71 or less"],
    ),
    (
        CORE + "ValueError: To serve at least one request with the models's max seq len (32768), (1.75 GiB KV cache "
        "is needed, which is larger than the available KV cache memory (0.52 GiB). Based on the available memory, "
        "the estimated maximum model length is 9728. Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine.",
        ["cannot hold one 32768-token sequence", "engine.max_model_len to 9728 or less"],
    ),
    (
        CORE + "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.",
        ["leave nothing for the KV cache", "raise engine.gpu_memory_utilization"],
    ),
    (
        CORE + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity "
        "of 79.19 GiB of which 1.02 GiB is free.",
        ["ran out of memory while the engine started (it asked for 2.32 GiB more)", "hardware.colocated=false"],
    ),
    (
        CORE + "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla "
        "T4 GPU has compute capability 7.5.",
        ["cannot run bf16", "engine.dtype=float16"],
    ),
    (
        CORE + "ModuleNotFoundError: No module named 'flashinfer'",
        ["needs the Python package 'flashinfer'", "VLLM_USE_FLASHINFER_SAMPLER=0"],
    ),
]


@pytest.mark.parametrize(("log", "fragments"), CASES, ids=["free-memory", "max-len", "no-kv", "oom", "bf16", "module"])
def test_known_causes_become_one_sentence(log, fragments):
    noise = "INFO 11-23 14:34:02 [model.py:623] Resolved architecture: Qwen2ForCausalLM\nTraceback (most recent...\n"
    sentence = explain(noise + log + "\nRuntimeError: Engine core initialization failed. See root cause above.")
    assert sentence is not None and "\n" not in sentence
    for fragment in fragments:
        assert fragment in sentence, sentence


def test_unknown_failures_are_left_alone():
    assert explain("RuntimeError: Engine core initialization failed. See root cause above.") is None


def test_the_driver_reports_the_sentence_alone():
    err = RuntimeError(
        "The actor died because of an error raised in its creation task, ray::VLLMEngine.__init__() (pid=1, "
        "ip=10.0.0.1)\n  File \"x.py\", line 3, in __init__\n    raise\n"
        "rlgen.engines.vllm.startup.EngineStartError: engine0 could not start: this GPU cannot run bf16; set "
        "engine.dtype=float16."
    )
    assert actor_death_detail(err) == "engine0 could not start: this GPU cannot run bf16; set engine.dtype=float16."


def _fake_nvml(monkeypatch, free_gib: float, total_gib: float) -> None:
    gib = 2**30
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(free=free_gib * gib, total=total_gib * gib),
    )
    third = types.ModuleType("vllm.third_party")
    third.pynvml = nvml
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.third_party", third)
    monkeypatch.setitem(sys.modules, "vllm.third_party.pynvml", nvml)


def test_too_little_free_memory_stops_before_vllm_starts(monkeypatch):
    _fake_nvml(monkeypatch, free_gib=50.0, total_gib=80.0)
    with pytest.raises(EngineStartError, match=r"engine0 could not start: only 50\.0 of the GPU's 80\.0 GiB .* "
                                                r"set it to 0\.57 or less"):
        check_free_memory("engine0", 0.9, gpus=[0])
    check_free_memory("engine0", 0.6, gpus=[0])  # 48 GiB of 50 free: starts
