"""LoRA runs on a local Ray cluster on CPU: the embedded default with learner.lora.rank=8 learns; a LoRA run stopped
and resumed is exactly the run that was never stopped (adapters, their optimizer state and the engines' merged
weights); final_model/ is a PEFT adapter folder, with merged/ on request; and a run started from that adapter
(learner.lora.init) gets it on the engines before its first rollout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rich.console import Console
from test_durable_runs import StopAtStep
from transformers import AutoModelForCausalLM

from helpers import assert_learned, assert_same_steps, train_or_stopped
from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime import RunStopped
from rlgen.runtime.run import run_training

pytest.importorskip("peft")

LORA = ["progress=false", "learner.lora.rank=8"]


pytestmark = pytest.mark.usefixtures("module_ray")  # one local cluster for the module's runs


def _run(out: Path, overrides: list[str], *, stop=None, resume: bool = False) -> RunStopped | None:
    return train_or_stopped([*LORA, *overrides], out, stop=stop, resume=resume)


# make test-all only; in make test: the adapter and merged folders, test_a_lora_run_saves_its_adapter_and_merged_model
@pytest.mark.long
@pytest.mark.slow
def test_lora_learns_on_the_default_task(tmp_path):
    out = tmp_path / "run"
    assert _run(out, []) is None
    summary = json.loads((out / "summary.json").read_text())
    assert_learned(read_jsonl(out / "metrics.jsonl"), summary, min_gain=0.1)


def test_a_lora_run_saves_its_adapter_and_merged_model(tmp_path):
    out = tmp_path / "run"
    assert _run(out, ["steps=4", "algo.prompts_per_step=8", "learner.lora.save_merged=true"]) is None
    summary = json.loads((out / "summary.json").read_text())
    final = out / "final_model"
    assert (final / "adapter_config.json").is_file() and (final / "adapter_model.safetensors").is_file()
    assert not (final / "model.safetensors").exists()  # the adapter, not the whole model
    merged = final / "merged"
    assert summary["merged_model_path"] == str(merged)
    # the merged folder is the base with the adapter in: it differs from the base in the adapted layers only
    base = AutoModelForCausalLM.from_pretrained(summary["initial_model_path"]).state_dict()
    whole = AutoModelForCausalLM.from_pretrained(merged).state_dict()
    changed = {k for k in base if not torch.equal(base[k], whole[k])}
    assert changed and all(k.endswith("_proj.weight") for k in changed)


def test_a_lora_run_stopped_and_resumed_equals_the_uninterrupted_run(tmp_path):
    overrides = ["steps=6", "algo.prompts_per_step=8", "checkpoint.every=0", "algo.kl_coef=0.05"]
    assert _run(tmp_path / "whole", overrides) is None
    reference = read_jsonl(tmp_path / "whole" / "metrics.jsonl")
    assert len(reference) == 6 and all("kl" in r for r in reference)
    out = tmp_path / "stopped"
    err = _run(out, overrides, stop=StopAtStep(3, out))
    assert err is not None and err.step == 3
    checkpoint = Path(err.checkpoint)
    assert (checkpoint / "model" / "adapter_model.safetensors").is_file()
    assert not (checkpoint / "model" / "model.safetensors").exists()
    assert _run(out, overrides, resume=True) is None
    assert_same_steps(read_jsonl(out / "metrics.jsonl"), reference)


def test_a_run_from_an_adapter_folder_starts_its_engines_on_it(tmp_path):
    first = tmp_path / "first"
    assert _run(first, ["steps=30", "algo.prompts_per_step=8"]) is None
    records = read_jsonl(first / "metrics.jsonl")
    second = tmp_path / "second"
    assert _run(second, ["steps=2", "algo.prompts_per_step=8", f"learner.lora.init={first / 'final_model'}"]) is None
    again = read_jsonl(second / "metrics.jsonl")
    # the engines sample from the adapter the learner starts from: engine and learner logprobs agree at step 0,
    # as they do within a run; the base alone would disagree with the trained adapter
    assert again[0]["mismatch/mean_abs_delta"] < 1e-4, again[0]
    assert records[-1]["mismatch/mean_abs_delta"] < 1e-4


# make test-all only; in make test: LoRA end to end: test_a_lora_run_saves_its_adapter_and_merged_model; adapters
# either way: test_validate
@pytest.mark.long
@pytest.mark.slow
def test_hf_engines_take_adapters_and_the_run_learns(tmp_path):
    """learner.lora.sync=adapter on CPU: the hf engines hold the base and take each adapter version through PEFT;
    engine and learner logprobs agree as with merged weights, and the run learns."""
    from rlgen.config import Transport

    plan = build_plan(compose_run_config([*LORA, "learner.lora.sync=adapter"]))
    assert plan.transport is Transport.lora_adapter
    out = tmp_path / "run"
    run_training(plan, out, Console(quiet=True))
    records = read_jsonl(out / "metrics.jsonl")
    assert_learned(records, json.loads((out / "summary.json").read_text()), min_gain=0.1)
    assert max(r["mismatch/mean_abs_delta"] for r in records) < 1e-4
