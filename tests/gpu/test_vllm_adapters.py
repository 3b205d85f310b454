"""VLLMEngine's LoRA adapters on a GPU: named adapters loaded from folders and picked per request, the policy
adapter a trainer sends, and unloading; each checked against the hf engine running the same adapter through PEFT
(teacher-forced logprobs of the tokens vLLM sampled)."""

from __future__ import annotations

import pytest

from helpers import lora_export, lora_model, save_small_qwen2
from rlgen.config import EngineConfig
from rlgen.types import GenRequest, SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 6, 7, 8, 9], [20, 21, 22], [100, 200, 300, 400]]
BASE_GAP = 0.08  # mean |Δ logprob| between bf16 vLLM and the fp32 hf reference on the base (0.050 measured)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return save_small_qwen2(tmp_path_factory.mktemp("qwen2-lora"))


def _adapter(model_path: str, seed: int, rank: int = 8) -> dict:
    import torch

    return lora_export(lora_model(model_path, seed, rank, scale=0.05), torch.bfloat16)


@pytest.fixture(scope="module")
def engines(model_path):
    from rlgen.engines.hf.engine import HFEngine
    from rlgen.engines.vllm.args import engine_args_for
    from rlgen.engines.vllm.engine import VLLMEngine

    cfg = EngineConfig(kind="vllm", gpu_memory_utilization=0.4, max_model_len=1024, max_num_seqs=64,
                       enforce_eager=True)
    vllm = VLLMEngine(model_path, cfg, device="cuda", seed=0, name="lora-engine",
                      engine_args=engine_args_for("ray_object_store", 16))
    reference = HFEngine(model_path, EngineConfig(dtype="float32"), device="cuda", name="reference")
    yield vllm, reference
    vllm.shutdown()


def _requests(adapter: str | None) -> list[GenRequest]:
    s = SamplingParams(n=2, temperature=1.0, max_new_tokens=24, seed=3)
    return [GenRequest(tuple(p), s, i, adapter) for i, p in enumerate(PROMPTS)]


def _gap(vllm, reference, adapter: str | None, reference_adapter: str | None) -> float:
    """Mean |Δ logprob| between vLLM's sampled-token logprobs and the reference's teacher-forced ones."""
    out = vllm.generate(_requests(adapter)).completions
    scored = reference.score([c.prompt_ids for c in out], [c.token_ids for c in out], 1.0, reference_adapter)
    deltas = [abs(a - b) for c, ref in zip(out, scored) for a, b in zip(c.logprobs, ref)]
    return sum(deltas) / len(deltas)


def test_named_and_policy_adapters_match_the_peft_reference(engines, model_path, tmp_path):
    from rlgen.adapter_folder import write_adapter

    vllm, reference = engines
    base_gap = _gap(vllm, reference, None, None)
    assert base_gap < BASE_GAP
    limit = 1.5 * base_gap + 0.01  # LoRA kernels add little to the bf16 gap the base already has

    named = _adapter(model_path, seed=1)
    write_adapter(str(tmp_path / "style"), named["tensors"], named["config"])
    assert vllm.add_adapter("style", str(tmp_path / "style"))["adapters"] == ["style"]
    reference.add_adapter("style", str(tmp_path / "style"))
    assert _gap(vllm, reference, "style", "style") < limit
    # the adapter matters: vLLM with it disagrees with the base reference far more than with the adapted one
    assert _gap(vllm, reference, "style", None) > 3 * _gap(vllm, reference, "style", "style")

    policy = _adapter(model_path, seed=2)
    assert vllm.load_adapter(policy, version=1)["version"] == 1
    reference.load_adapter(policy, version=1)
    assert _gap(vllm, reference, None, None) < limit  # requests naming no adapter run on the policy
    assert _gap(vllm, reference, "style", "style") < limit  # named ones still on theirs

    assert vllm.remove_adapter("style")["adapters"] == []
    with pytest.raises(Exception, match="no adapter named 'style' is loaded"):
        vllm.generate(_requests("style"))


def test_an_engine_that_took_adapters_alone_is_kept_with_its_folders_weights(engines, model_path):
    """Kept warm after a LoRA run (its adapters sent as adapters): the base it holds is its model folder's, so it
    needs no reload, which a LoRA build cannot do (its layers name the base weights base_layer.*: vLLM's
    reload_weights failed on them), and it is ready for the next run at once."""
    vllm, _ = engines
    vllm.load_adapter(_adapter(model_path, seed=3), version=2)
    kept = vllm.keep_for_next_run()
    assert kept["start_weights"] is True and vllm.version == 0
    took = vllm.take_over(version=0)
    assert took["ok"] and took["start_weights"] is True
    out = vllm.generate(_requests(None)).completions
    assert len(out) == 2 * len(PROMPTS) and all(c.version == 0 for c in out)
