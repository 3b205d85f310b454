"""YaRN context extension (rlgen.rope, rlgen.plan.context): a preset whose longest sequence is past its positions
gets the smallest factor that holds it, and its built folder says so to the learner and the engine alike; a
folder of one's own runs as its config.json says; a factor that cannot be is refused with its fix."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from helpers import save_tiny_qwen2
from rlgen.config.compose import compose_run_config
from rlgen.engines.vllm.args import model_context_length
from rlgen.models.build import hf_config
from rlgen.plan import PlanError, build_plan
from rlgen.rope import context_positions, rope_parameters, yarn_factor_of

QWEN_CARD = {"max_position_embeddings": 32768,  # as Qwen2.5's model cards tell one to extend it
             "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}


def test_the_rope_settings_of_a_config_json():
    assert yarn_factor_of(QWEN_CARD) == 4.0 and context_positions(QWEN_CARD) == 131072
    v5 = {"max_position_embeddings": 32768, "rope_parameters": rope_parameters(1e6, 32768, 2.0)}
    assert v5["rope_parameters"]["rope_type"] == "yarn" and context_positions(v5) == 65536
    plain = {"max_position_embeddings": 32768, "rope_parameters": rope_parameters(1e6, 32768, None)}
    assert plain["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}
    assert yarn_factor_of(plain) is None and context_positions(plain) == 32768
    assert context_positions({}) is None


def plan_of(*overrides: str):
    return build_plan(compose_run_config(list(overrides)))


def yarn_setting(plan):
    return next((s for s in plan.settings if s.key == "model.yarn_factor"), None)


@pytest.mark.parametrize(("new_tokens", "factor"), [(100, None), (200, 2.0), (400, 4.0)])
def test_a_preset_gets_the_smallest_factor_its_longest_sequence_needs(new_tokens, factor):
    plan = plan_of(f"algo.max_new_tokens={new_tokens}", "task.max_prompt_tokens=16")  # the tiny preset: 128 positions
    assert plan.config.model.yarn_factor == factor
    assert (yarn_setting(plan) is None) == (factor is None)
    assert plan.config.engine.max_model_len == 16 + new_tokens
    if factor:
        assert "YaRN x" in yarn_setting(plan).source


def test_the_length_check_names_the_factor_that_would_hold_the_sequence():
    with pytest.raises(PlanError) as err:  # a factor given too small
        plan_of("algo.max_new_tokens=400", "task.max_prompt_tokens=16", "model.yarn_factor=2")
    text = " ".join(err.value.problems)
    assert "max_position_embeddings=128 with YaRN x2 (256)" in text and "model.yarn_factor=4," in text
    with pytest.raises(PlanError) as err:  # past every factor: no YaRN offered
        plan_of("algo.max_new_tokens=600", "task.max_prompt_tokens=16")
    text = " ".join(err.value.problems)
    assert "max_position_embeddings=128;" in text and "yarn" not in text.lower()


def test_a_factor_below_one_is_refused():
    with pytest.raises(PlanError, match="must be at least 1"):
        plan_of("model.yarn_factor=0.5")


def _folder(tmp_path, hf_extra: dict | None = None) -> str:
    path = save_tiny_qwen2(tmp_path / "m", max_position_embeddings=128)
    if hf_extra:
        config = tmp_path / "m" / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), **hf_extra}))
    return path


def test_a_folder_with_yarn_runs_as_its_config_says(tmp_path):
    path = _folder(tmp_path, {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}})
    plan = plan_of(f"model.path={path}", "algo.max_new_tokens=400", "task.max_prompt_tokens=16")
    assert plan.config.model.yarn_factor == 4.0
    assert yarn_setting(plan).source == "the model folder's config.json"
    assert model_context_length(path) == 512  # the engine is given the extended length


def test_a_folder_without_yarn_is_not_extended_behind_its_back(tmp_path):
    path = _folder(tmp_path)
    with pytest.raises(PlanError) as err:
        plan_of(f"model.path={path}", "model.yarn_factor=4", "task.max_prompt_tokens=16")
    text = " ".join(err.value.problems)
    assert '"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 128}' in text
    with pytest.raises(PlanError, match="max_position_embeddings=128"):
        plan_of(f"model.path={path}", "algo.max_new_tokens=400", "task.max_prompt_tokens=16")


def test_a_built_preset_carries_yarn_into_the_model_the_learner_loads(tmp_path):
    cfg = plan_of("algo.max_new_tokens=400").config
    config = hf_config(cfg.model, 32)
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 4.0
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    extended = AutoModelForCausalLM.from_config(config)
    extended.save_pretrained(tmp_path / "yarn")
    assert model_context_length(str(tmp_path / "yarn")) == 512
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "yarn")
    ids = torch.randint(3, 32, (1, 400))
    with torch.no_grad():
        out = loaded(ids).logits  # a sequence past the 128 positions it was built with
        plain = AutoModelForCausalLM.from_config(hf_config(dataclasses.replace(cfg.model, yarn_factor=None), 32))
        plain.load_state_dict(loaded.state_dict())
        base = plain(ids).logits
    assert torch.isfinite(out).all()
    assert not torch.allclose(out[0, 200:], base[0, 200:])  # YaRN rotates far positions otherwise
