"""What a vLLM engine's start no longer waits for: vLLM's inspection of the model class, begun at launch in a
process of its own (rlgen.engines.vllm.modelinfo), and a spawned engine core where a forked one is safe
(rlgen.engines.vllm.fork). No GPU and no vllm here: the inspecting process finds no vllm and ends."""

from __future__ import annotations

import json

import pytest

from rlgen.config import ModelConfig
from rlgen.engines.vllm.args import REQUIRED_ENV
from rlgen.engines.vllm.fork import fork_allowed
from rlgen.engines.vllm.modelinfo import cached, start_inspection, vllm_cache_root
from rlgen.models import architectures


def test_vllms_cache_folder_is_found_as_vllm_finds_it(tmp_path):
    assert vllm_cache_root({"VLLM_CACHE_ROOT": str(tmp_path / "v")}) == tmp_path / "v"
    assert vllm_cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "vllm"
    assert vllm_cache_root({}).name == "vllm"


def test_the_inspection_starts_only_for_classes_the_cache_lacks(tmp_path):
    env = {"VLLM_CACHE_ROOT": str(tmp_path)}
    proc = start_inspection(["Qwen2ForCausalLM"], env)
    assert proc is not None and proc.wait(timeout=60) == 0  # without vllm it ends at once, quietly
    infos = tmp_path / "modelinfos"
    infos.mkdir()
    (infos / "vllm-model_executor-models-qwen2-Qwen2ForCausalLM.json").write_text("{}")
    assert cached("Qwen2ForCausalLM", env) and not cached("LlamaForCausalLM", env)
    assert start_inspection(["Qwen2ForCausalLM", ""], env) is None  # cached already: no process


def test_a_models_architectures_come_from_its_folder_or_the_presets(tmp_path):
    assert architectures(ModelConfig()) == ["Qwen2ForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert architectures(ModelConfig(path=str(tmp_path))) == ["LlamaForCausalLM"]
    assert architectures(ModelConfig(path=str(tmp_path / "missing"))) == []


@pytest.mark.parametrize(("method", "cuda", "actor", "fork"), [
    ("fork", False, True, True),
    (None, False, True, True),  # rlgen's default, at any tensor parallel size
    ("spawn", False, True, False),  # engine.env chose spawn
    ("fork", True, True, False),  # CUDA is initialized in the actor: a forked child could not use it
    ("fork", False, False, False),  # built inside another program, which may have touched CUDA
])
def test_the_engine_core_is_forked_only_where_that_is_safe(monkeypatch, method, cuda, actor, fork):
    if method is None:
        monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    else:
        monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", method)
    assert fork_allowed(cuda, actor) is fork


def test_the_actor_looks_for_its_gpu_without_initializing_cuda():
    assert REQUIRED_ENV["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
    assert REQUIRED_ENV["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
