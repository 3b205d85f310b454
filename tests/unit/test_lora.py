"""LoRA on the torch learner (PEFT): only the adapters train, the reference is the base with them off, the merged
export is PEFT's own merge under the base's names, and an adapter saved to a folder comes back exactly."""

from __future__ import annotations

import pytest
import torch
from test_torch_learner import make_batch
from transformers import AutoModelForCausalLM

from helpers import algo_cfg, nudge_lora, save_tiny_qwen2
from rlgen.adapter_folder import write_adapter
from rlgen.config import LORA_BLOCK_LINEARS, MonitorConfig
from rlgen.learners.lora import (
    LoraError,
    LoraSpec,
    adapter_config,
    adapter_weights,
    merged_weights,
    wrap,
)
from rlgen.learners.torch import TorchLearner

pytest.importorskip("peft")

LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": LORA_BLOCK_LINEARS}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_qwen2(tmp_path_factory.mktemp("base"))


def _base(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


IDS = torch.tensor([[3, 5, 7, 9, 11, 2], [4, 6, 8, 10, 12, 14]])


def test_merged_weights_are_peft_merge_under_the_base_names(base_dir):
    model = wrap(_base(base_dir), LoraSpec(**LORA))
    nudge_lora(model)
    merged = dict(merged_weights(model))
    reference = wrap(_base(base_dir), LoraSpec(**LORA))
    reference.load_state_dict(model.state_dict())
    whole = reference.merge_and_unload().state_dict()
    assert set(merged) == {k for k, _ in _base(base_dir).named_parameters()}
    for name, tensor in merged.items():
        assert torch.allclose(tensor, whole[name], atol=1e-6), name
    changed = [n for n in merged if not torch.equal(merged[n], _base(base_dir).state_dict()[n])]
    assert changed and all(any(t in n for t in LORA_BLOCK_LINEARS) for n in changed)


def test_the_reference_is_the_base_with_the_adapters_off(base_dir):
    learner = TorchLearner(base_dir, algo_cfg(lr=1e-3, kl_coef=0.1), MonitorConfig(), lora=LORA)
    nudge_lora(learner.peft)
    with torch.no_grad():
        ref = learner.core.ref_model(input_ids=IDS).logits
        policy = learner.model(input_ids=IDS).logits
        base = _base(base_dir)(input_ids=IDS).logits
    assert torch.allclose(ref, base, atol=1e-5)
    assert not torch.allclose(policy, base, atol=1e-3)  # the adapters are on outside the reference
    assert sum(p.numel() for p in learner.core.ref_model.parameters()) == 0  # no second copy of the weights


def test_only_the_adapters_train_and_the_export_keeps_the_base_names(base_dir):
    learner = TorchLearner(base_dir, algo_cfg(lr=1e-2), MonitorConfig(), lora=LORA)
    assert learner.params and all(".lora_" in n for n, p in learner.model.named_parameters() if p.requires_grad)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    out = learner.train_step(make_batch(_base(base_dir))).record()
    assert out["skipped"] is False and out["version"] == 1
    after = dict(learner.model.named_parameters())
    moved = [n for n in before if not torch.equal(before[n], after[n])]
    assert moved and all(".lora_" in n for n in moved)
    weights = learner.get_weights()
    assert set(weights) == set(_base(base_dir).state_dict())
    adapter = learner.get_adapter("bfloat16")
    assert adapter["version"] == 1 and adapter["config"]["r"] == 4
    assert all(".lora_" in k and t.dtype == torch.bfloat16 for k, t in adapter["tensors"].items())


def test_an_adapter_saved_to_a_folder_comes_back_exactly(base_dir, tmp_path):
    model = wrap(_base(base_dir), LoraSpec(**LORA))
    nudge_lora(model)
    write_adapter(str(tmp_path / "a"), adapter_weights(model), adapter_config(model))
    again = wrap(_base(base_dir), LoraSpec(rank=8, alpha=1.0), str(tmp_path / "a"))  # the folder's rank wins
    with torch.no_grad():
        assert torch.equal(model(input_ids=IDS).logits, again(input_ids=IDS).logits)
    assert any(p.requires_grad for p in again.parameters())  # it trains on from there


def test_a_learner_starts_from_an_adapter_folder(base_dir, tmp_path):
    model = wrap(_base(base_dir), LoraSpec(**LORA))
    nudge_lora(model)
    write_adapter(str(tmp_path / "a"), adapter_weights(model), adapter_config(model))
    learner = TorchLearner(base_dir, algo_cfg(lr=1e-3), MonitorConfig(), lora=LORA, lora_init=str(tmp_path / "a"))
    merged = dict(merged_weights(model))
    for name, tensor in learner.get_weights().items():
        assert torch.allclose(tensor, merged[name]), name


def test_target_modules_the_model_lacks_and_a_folder_that_is_no_adapter_are_one_sentence(base_dir, tmp_path):
    with pytest.raises(LoraError, match=r"names modules the model does not have; its linear layers are \['down_proj'"):
        wrap(_base(base_dir), LoraSpec(rank=4, alpha=8.0, target_modules=("qkv_proj",)))
    with pytest.raises(LoraError, match="is not a PEFT adapter folder"):
        wrap(_base(base_dir), LoraSpec(**LORA), str(tmp_path))


def test_the_gpu_weight_paths_send_the_merged_weights_under_the_base_names(base_dir):
    from rlgen.learners.sending import PolicySender

    cls = type("TorchLearnerWithSender", (PolicySender, TorchLearner), {})
    learner = cls(base_dir, algo_cfg(lr=1e-3), MonitorConfig(), lora=LORA)
    nudge_lora(learner.peft)
    base = _base(base_dir)
    meta = learner.weight_meta("float32")
    assert meta["names"] == [n for n, _ in base.named_parameters()]
    assert meta["shapes"] == [list(p.shape) for _, p in base.named_parameters()]
    sent = dict(learner.iter_weights("float32"))
    exported = learner.get_weights()
    assert list(sent) == meta["names"]
    assert all(torch.equal(sent[n], exported[n]) for n in sent)
