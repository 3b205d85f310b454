"""LoRA adapters on the hf engine: the policy adapter a trainer sends and named adapters loaded from folders give
the logprobs of PEFT's own model with that adapter, requests pick theirs by name, the base stays reachable, whole
weights still load, and an adapter of another base is refused without changing anything."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import lora_export, lora_model, save_tiny_qwen2
from rlgen.adapter_folder import write_adapter
from rlgen.config import EngineConfig
from rlgen.engines.hf.adapters import AdapterError
from rlgen.engines.hf.engine import HFEngine
from rlgen.types import GenRequest, SamplingParams

pytest.importorskip("peft")

PROMPTS = [[3, 5, 7, 9], [4, 6, 8, 10, 12]]


def _tiny(path, seed=0, hidden=32):
    return save_tiny_qwen2(path, seed, vocab_size=40, hidden_size=hidden, eos_token_id=1)


def _adapter(base_dir, seed, rank=4):
    """A PEFT model on the base with non-zero adapters, and its export."""
    model = lora_model(base_dir, seed, rank, scale=0.2)
    return model, lora_export(model)


def _peft_logprobs(model, prompt, tokens):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    logp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return logp[len(prompt) - 1 :].tolist()


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return _tiny(tmp_path_factory.mktemp("base"))


def _engine(base_dir):
    return HFEngine(base_dir, EngineConfig(dtype="float32"), name="engine0")


def _greedy(engine, adapter=None, n_tokens=6):
    reqs = [GenRequest(tuple(p), SamplingParams(temperature=0.0, max_new_tokens=n_tokens, ignore_eos=True), i, adapter)
            for i, p in enumerate(PROMPTS)]
    return engine.generate(reqs).completions


def test_policy_and_named_adapters_match_peft(base_dir, tmp_path):
    engine = _engine(base_dir)
    base_out = _greedy(engine)
    policy_model, policy = _adapter(base_dir, seed=1)
    named_model, named = _adapter(base_dir, seed=2, rank=8)
    write_adapter(str(tmp_path / "named"), named["tensors"], named["config"])

    res = engine.load_adapter(policy, version=3)
    assert res["version"] == 3 and engine.version == 3 and res["bytes"] > 0
    engine.add_adapter("style", str(tmp_path / "named"))
    assert engine.health()["adapters"] == ["style"]

    for adapter, model in ((None, policy_model), ("style", named_model)):
        out = _greedy(engine, adapter)
        for prompt, c in zip(PROMPTS, out):
            want = _peft_logprobs(model, prompt, c.token_ids)
            assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(want), atol=1e-4), adapter
            assert c.version == 3
    assert [c.token_ids for c in _greedy(engine)] != [c.token_ids for c in base_out]  # the adapters change outputs
    scored = engine.score([PROMPTS[0]], [base_out[0].token_ids])[0]
    assert torch.allclose(torch.tensor(scored), torch.tensor(_peft_logprobs(policy_model, PROMPTS[0],
                                                                            base_out[0].token_ids)), atol=1e-4)

    # a new policy version with the same config replaces the tensors in place
    newer_model, newer = _adapter(base_dir, seed=5)
    engine.load_adapter(newer, version=4)
    c = _greedy(engine)[1]
    assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(_peft_logprobs(newer_model, PROMPTS[1], c.token_ids)),
                          atol=1e-4)

    engine.remove_adapter("style")
    with pytest.raises(AdapterError, match="no adapter named 'style'"):
        _greedy(engine, "style")
    assert engine.health()["adapters"] == []


def test_whole_weights_still_load_under_base_names(base_dir):
    engine = _engine(base_dir)
    _, policy = _adapter(base_dir, seed=1)
    engine.load_adapter(policy, version=1)
    other = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    changed = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in other.state_dict().items()}
    before = [c.logprobs for c in _greedy(engine)]
    assert engine.update_weights(changed, version=2)["version"] == 2
    assert [c.logprobs for c in _greedy(engine)] != before


def test_adapter_of_another_base_is_refused_and_changes_nothing(base_dir, tmp_path):
    other = _tiny(tmp_path / "other", seed=1, hidden=48)
    _, foreign = _adapter(other, seed=1)
    write_adapter(str(tmp_path / "foreign"), foreign["tensors"], foreign["config"])
    engine = _engine(base_dir)
    before = [c.token_ids for c in _greedy(engine)]
    with pytest.raises(AdapterError, match="trained on another base"):
        engine.add_adapter("foreign", str(tmp_path / "foreign"))
    with pytest.raises(AdapterError, match="trained on another base"):
        engine.load_adapter(foreign, version=1)
    assert engine.health()["adapters"] == [] and engine.version == 0
    assert [c.token_ids for c in _greedy(engine)] == before
    with pytest.raises(AdapterError, match="not a PEFT adapter folder"):
        engine.add_adapter("nothing", str(tmp_path))


def test_unloading_the_last_adapter_gives_back_the_engine_it_was(base_dir, tmp_path):
    """After a named adapter is loaded, used and unloaded, the engine samples what a fresh engine samples with the
    very same logprobs (PEFT freezes the base and leaves it frozen; that alone moved CPU logprobs by about 1e-7)."""
    sampling = SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=7, ignore_eos=True)
    reqs = [GenRequest(tuple(p), sampling, i) for i, p in enumerate(PROMPTS)]
    fresh = _engine(base_dir).generate(reqs).completions
    engine = _engine(base_dir)
    _, adapter = _adapter(base_dir, seed=3)
    write_adapter(str(tmp_path), adapter["tensors"], adapter["config"])
    engine.add_adapter("style", str(tmp_path))
    _greedy(engine, "style")
    engine.remove_adapter("style")
    again = engine.generate(reqs).completions
    assert [c.token_ids for c in again] == [c.token_ids for c in fresh]
    assert [c.logprobs for c in again] == [c.logprobs for c in fresh]
    assert all(p.requires_grad for p in engine.model.parameters())
