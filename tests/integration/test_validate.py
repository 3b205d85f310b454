"""`rlgen validate` on CPU: hf against itself passes; a noisy engine and a perturbed precision fail."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from helpers import lora_export, lora_model
from rlgen.config.compose import compose_run_config
from rlgen.engines.hf.engine import HFEngine
from rlgen.engines.noisy import NoisyEngine
from rlgen.models import prepare_model
from rlgen.types import GenRequest, SamplingParams
from rlgen.validate.run import Perturb, ValidateConfig, draw_cases, run_validate

CASES = 8


@pytest.fixture(scope="module")
def cfg():
    return compose_run_config(["progress=false"])


@pytest.fixture(scope="module")
def model_path(cfg):
    return prepare_model(cfg)


def _v(**kw) -> ValidateConfig:
    return ValidateConfig(cases=CASES, **kw)


def test_cases_are_heterogeneous_and_repeatable():
    v = ValidateConfig(cases=30, max_requests=4, max_prompt_tokens=12, max_n=3, temperatures=[0.0, 0.7, 1.3])
    cases = draw_cases(v, vocab_size=90, special_ids={0, 1, 2})
    assert len(cases) == 30 and cases == draw_cases(v, 90, {0, 1, 2})
    reqs = [r for c in cases for r in c]
    assert len({len(r.prompt_ids) for r in reqs}) > 5
    assert any(len({len(r.prompt_ids) for r in c}) > 1 for c in cases)  # ragged prompts in one batch
    assert {r.n for r in reqs} == {1, 2, 3}
    assert {r.temperature for r in reqs} == {0.0, 0.7, 1.3}
    assert any(len({r.temperature for r in c}) > 1 for c in cases)  # mixed sampling in one batch
    assert all(t not in {0, 1, 2} and 0 <= t < 90 for r in reqs for t in r.prompt_ids)
    assert draw_cases(dataclasses.replace(v, seed=1), 90, {0, 1, 2}) != cases


def test_hf_against_itself_passes(cfg, tmp_path):
    report = run_validate(cfg, _v(perturb=Perturb.none), out_dir=tmp_path)
    assert report.passed, report.rows
    names = [r.name for r in report.rows]
    assert "teacher-forced" in names and names[-1] == "all"
    for r in report.rows:
        assert r.k3_kl < 1e-9 and r.max_abs_delta < 1e-4
        assert r.greedy_agreement in (None, 1.0)
    data = json.loads((tmp_path / "validate.json").read_text())
    assert data["passed"] is True and len(data["cases"]) == CASES
    assert data["settings"]["kl_tolerance"] == 1e-3


def test_perturbed_precision_fails_and_bf16_rounding_passes(cfg):
    fp8 = run_validate(cfg, _v(perturb=Perturb.float8_e5m2))
    assert not fp8.passed
    assert fp8.row("all").k3_kl > 1e-3
    assert fp8.worst_case is not None and fp8.worst_case["k3_kl"] >= fp8.row("all").k3_kl
    bf16 = run_validate(cfg, _v(perturb=Perturb.bfloat16))
    assert bf16.passed and 0 < bf16.row("all").k3_kl < 1e-3


def test_noisy_engine_fails_validate(cfg):
    report = run_validate(cfg, _v(), engine_cls=NoisyEngine, engine_kwargs={"noise_std": 0.1})
    assert not report.passed
    assert report.candidate == "NoisyEngine(noise_std=0.1)"
    assert all(not r.passed for r in report.rows if r.tokens >= 5)
    assert 1e-3 < report.row("all").k3_kl < 0.05  # about exp(0.1**2 / 2) - 1 = 0.005


def test_noisy_engine_without_noise_passes(cfg):
    report = run_validate(cfg, _v(), engine_cls=NoisyEngine, engine_kwargs={"noise_std": 0.0})
    assert report.passed


def test_tolerance_is_configurable(cfg):
    loose = run_validate(cfg, _v(kl_tolerance=1.0), engine_cls=NoisyEngine, engine_kwargs={"noise_std": 0.1})
    assert loose.passed


def test_candidate_in_a_ray_actor_fails_the_same_way(cfg):
    """The path engine=vllm takes: the candidate runs as a Ray actor."""
    report = run_validate(
        cfg, _v(runner="ray"), engine_cls=NoisyEngine, engine_kwargs={"noise_std": 0.1}
    )
    assert not report.passed and report.row("all").tokens > 0


def test_engine_vllm_builds_vllm_engine_with_its_env(cfg, monkeypatch):
    """engine=vllm imports rlgen.engines.vllm.engine.VLLMEngine lazily and passes the plan's env (a stand-in here)."""
    import rlgen.plan
    import rlgen.validate.run

    made = []

    class FakeVLLMEngine(HFEngine):
        def __init__(self, *args, env=None, **kwargs):
            made.append({"env": env, "engine": args[1], **kwargs})
            super().__init__(*args, **kwargs)

    monkeypatch.setitem(sys.modules, "rlgen.engines.vllm.engine", types.SimpleNamespace(VLLMEngine=FakeVLLMEngine))
    from rlgen.engines.registry import engine_spec

    plan = rlgen.plan.build_plan(cfg)
    vcfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, kind="vllm", dtype="float32"))
    vllm_plan = dataclasses.replace(plan, config=dataclasses.replace(plan.config, engine=vcfg.engine),
                                    engine=engine_spec("vllm"), engine_env={"X": "1"})
    monkeypatch.setattr(rlgen.validate.run, "build_plan", lambda c: vllm_plan)
    report = run_validate(vcfg, ValidateConfig(cases=3, runner="local"))
    assert report.passed and report.engine == "vllm" and report.candidate == "vllm float32"
    # the stand-in has HFEngine's score(), but the vllm kind claims no ScoresTokens: no teacher-forced row
    assert "teacher-forced" not in [r.name for r in report.rows]
    assert made[0]["env"] == {"X": "1"} and made[0]["name"] == "candidate"
    assert made[0]["engine"].gpu_memory_utilization <= 0.5  # it shares the GPU with the reference


def test_noisy_engine_keeps_the_tokens_and_noises_the_logprobs(cfg, model_path):
    clean = HFEngine(model_path, cfg.engine, seed=3)
    noisy = NoisyEngine(model_path, cfg.engine, seed=3, noise_std=0.5)
    reqs = [GenRequest((5, 6, 7, 8), SamplingParams(n=16, temperature=1.0, max_new_tokens=8, seed=1), 0)]
    a, b = clean.generate(reqs).completions, noisy.generate(reqs).completions
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    d = torch.tensor([y - x for ca, cb in zip(a, b) for x, y in zip(ca.logprobs, cb.logprobs)])
    assert d.numel() > 20 and 0.3 < float(d.std()) < 0.7
    prompts, toks = [list(c.prompt_ids) for c in a], [c.token_ids for c in a]
    s = torch.tensor([y - x for ra, rb in zip(clean.score(prompts, toks), noisy.score(prompts, toks)) for x, y in zip(ra, rb)])
    assert 0.3 < float(s.std()) < 0.7
    assert noisy.health()["noise_std"] == 0.5
    with pytest.raises(ValueError, match="noise_std"):
        NoisyEngine(model_path, cfg.engine, noise_std=-1)


def _cli(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlgen.cli", "validate", f"hydra.run.dir={tmp_path}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_cli_fails_on_cpu_by_default_and_passes_unperturbed(tmp_path):
    failed = _cli([], tmp_path / "default")
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "FAIL" in failed.stdout and "float8_e5m2" in failed.stdout
    data = json.loads((tmp_path / "default" / "validate.json").read_text())
    assert data["passed"] is False and math.isfinite(data["rows"][-1]["k3_kl"])
    passed = _cli(["++validate.perturb=none"], tmp_path / "none")
    assert passed.returncode == 0, passed.stderr[-2000:]
    assert "PASS" in passed.stdout


class AdapterIgnored(HFEngine):
    """An hf engine that takes a LoRA adapter and drops it: validate must catch it."""

    def load_adapter(self, adapter, version, timeout_s=None):
        self.version = int(version)
        return {"version": self.version, "spans": []}


@pytest.fixture(scope="module")
def adapter_dir(model_path, tmp_path_factory):
    """A LoRA adapter on the default model with a visible effect (PEFT starts lora_B at zero)."""
    pytest.importorskip("peft")
    from rlgen.adapter_folder import write_adapter

    adapter = lora_export(lora_model(model_path, seed=0))
    path = tmp_path_factory.mktemp("adapter")
    write_adapter(str(path), adapter["tensors"], adapter["config"])
    return str(path)


@pytest.mark.parametrize("sync", ["adapter", "merged"])
def test_validate_with_a_lora_adapter_sent_either_way(adapter_dir, sync):
    cfg = compose_run_config(["progress=false", f"learner.lora.init={adapter_dir}", f"learner.lora.sync={sync}",
                              "validate.perturb=none"])
    report = run_validate(cfg, _v(perturb="none"))
    assert report.passed, report.rows
    how = "as an adapter" if sync == "adapter" else "merged into the weights"
    assert f"LoRA adapter {adapter_dir} {how}" in report.candidate


def test_validate_catches_an_engine_that_drops_the_adapter(adapter_dir):
    cfg = compose_run_config(["progress=false", f"learner.lora.init={adapter_dir}", "learner.lora.sync=adapter"])
    report = run_validate(cfg, _v(), engine_cls=AdapterIgnored)
    assert not report.passed


def test_validate_checks_an_engine_at_a_given_length(cfg):
    v = ValidateConfig(cases=2, max_requests=2, max_n=1, max_new_tokens=4, length=300, perturb=Perturb.none)
    cases = draw_cases(v, 40, {0, 1, 2})
    assert all(len(r.prompt_ids) == 296 for case in cases for r in case)  # the responses start at position 296
    assert cases == draw_cases(v, 40, {0, 1, 2})  # repeatable, as the drawn cases are
    same = run_validate(cfg, v)  # past the tiny preset's 128 positions: the plan extends them with YaRN x4
    assert same.passed and same.settings["length"] == 300
    config = json.loads((Path(same.settings["model_path"]) / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "yarn" and config["rope_parameters"]["factor"] == 4.0
    noisy = run_validate(cfg, v, engine_cls=NoisyEngine, engine_kwargs={"noise_std": 0.1})
    assert not noisy.passed  # at that length too, a wrong engine fails
