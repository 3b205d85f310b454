"""The plans of `rlgen serve` and of `rlgen train engine=remote`: what each places, what it reads from the
server, and the problems it refuses before anything starts."""

from __future__ import annotations

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan import PlanError, Transport, build_plan, count_params
from rlgen.plan.placement import plan_bundles
from rlgen.plan.serve import build_serve_plan, is_loopback
from rlgen.wire.client import ServerError

URL = "http://127.0.0.1:8000"


def _info(cfg, **over):
    params, vocab = count_params(compose_run_config(cfg).model)
    return {"model": "tiny", "params": params, "vocab_size": vocab, "data_parallel": 2, "tensor_parallel_size": 1,
            "max_model_len": 128, "engine_kind": "hf", "versions": [0, 0], **over}


@pytest.fixture
def server(monkeypatch):
    """The /info the plan reads, and the URL and token it was asked with."""
    state = {"info": _info([]), "asked": []}

    def fetch(url, token, timeout_s=10.0):
        state["asked"].append((url, token))
        if isinstance(state["info"], Exception):
            raise state["info"]
        return state["info"]

    monkeypatch.setattr("rlgen.engines.remote.plan.fetch_info", fetch)
    return state


def test_remote_plan_places_only_learners_and_reads_the_server(server, monkeypatch):
    monkeypatch.setenv("RLGEN_SERVE_TOKEN", "tok")
    plan = build_plan(compose_run_config(["engine=remote", f"engine.url={URL}"]))
    assert server["asked"] == [(URL, "tok")]
    assert plan.engine_kind == "remote" and len(plan.engines) == 2 and plan.transport is Transport.http
    assert {s.key: s.source for s in plan.settings}["engine.num_engines"].startswith(f"server {URL}")
    placement = plan_bundles(plan)
    assert all(a.num_gpus == 0 and a.num_cpus == 0.5 for a in placement.engines)


def test_remote_plan_on_gpus_gives_every_gpu_to_learners_and_picks_nccl_for_vllm(server):
    server["info"] = _info(["model=qwen2_5_0_5b"], engine_kind="vllm", max_model_len=4096, tensor_parallel_size=2,
                           weights_over=["http", "nccl"])
    plan = build_plan(compose_run_config(["engine=remote", f"engine.url={URL}", "hardware=2xh200",
                                          "model=qwen2_5_0_5b"]))
    assert [lr.gpu for lr in plan.learners] == [0, 1] and not plan.colocated
    assert plan.transport is Transport.nccl and [e.tensor_parallel_size for e in plan.engines] == [2, 2]
    assert all(a.num_gpus == 0 for a in plan_bundles(plan).engines)
    http = build_plan(compose_run_config(["engine=remote", f"engine.url={URL}", "hardware=2xh200",
                                          "model=qwen2_5_0_5b", "engine.weights_over=http"]))
    assert http.transport is Transport.http


def test_learners_joining_a_servers_nccl_group_take_its_nccl_settings(server):
    """NCCL cannot join two processes that differ in NCCL_CUMEM_ENABLE, and a server's vLLM engines run with 0:
    the plan copies the server's NCCL settings into the env its learners get (over HTTP nothing is copied)."""
    from rlgen.serve.pool import EnginePool, ServedModel

    model = ServedModel("m", "/m", 1, 8, 64, "vllm", 1, nccl_weights=True, nccl_env={"NCCL_CUMEM_ENABLE": "0"})
    reported = EnginePool([object()], model, timeout_s=5.0, local=True).info()  # what /info says
    assert reported["nccl_env"] == {"NCCL_CUMEM_ENABLE": "0"}
    server["info"] = _info(["model=qwen2_5_0_5b"], engine_kind="vllm", max_model_len=4096,
                           weights_over=["http", "nccl"], nccl_env=reported["nccl_env"])
    common = ["engine=remote", f"engine.url={URL}", "hardware=2xh200", "model=qwen2_5_0_5b"]
    plan = build_plan(compose_run_config(common))
    assert plan.transport is Transport.nccl and plan.engine_env["NCCL_CUMEM_ENABLE"] == "0"
    assert {s.key: s.source for s in plan.settings}["engine.env"].startswith(f"server {URL} (the NCCL settings")
    http = build_plan(compose_run_config([*common, "engine.weights_over=http"]))
    assert "NCCL_CUMEM_ENABLE" not in http.engine_env


@pytest.mark.parametrize(("overrides", "info", "text"), [
    (["engine=remote"], None, "engine=remote needs the address of a running server: set engine.url="),
    (["engine=remote", f"engine.url={URL}"], ServerError("no answer from the rlgen server at X", None),
     "no answer from the rlgen server"),
    (["engine=remote", f"engine.url={URL}"], ServerError("401", 401), "wants a bearer token: set RLGEN_SERVE_TOKEN"),
    (["engine=remote", f"engine.url={URL}", "model=qwen2_5_0_5b"], "tiny",
     "serves tiny (79,872 parameters, vocabulary 87), but this run trains model qwen2_5_0_5b"),
    (["engine=remote", f"engine.url={URL}", "engine.num_engines=3"], "tiny", "the server at http://127.0.0.1:8000 "
     "has 2 engines"),
    (["engine=remote", f"engine.url={URL}", "engine.weights_over=nccl"], "tiny", "engine.weights_over=nccl needs "
     "learners on GPUs"),
    (["engine=remote", f"engine.url={URL}", "task.max_prompt_tokens=200"], "tiny", "engine.max_model_len=128 cannot "
     "hold task.max_prompt_tokens=200 + algo.max_new_tokens=4 = 204; start the server with engine.max_model_len>=204"),
])
def test_remote_plan_refusals(server, overrides, info, text):
    if isinstance(info, Exception):
        server["info"] = info
    with pytest.raises(PlanError) as err:
        build_plan(compose_run_config(overrides))
    assert any(text in p for p in err.value.problems), err.value.problems


def test_serve_plan_uses_every_gpu_for_engines():
    plan = build_serve_plan(compose_run_config(["engine=vllm", "hardware=2xh200", "serve.data_parallel=2",
                                                "model=qwen2_5_1_5b"]))
    assert [e.gpus for e in plan.engines] == [(0,), (1,)] and plan.learners == ()
    settings = {s.key: s.value for s in plan.settings}
    assert settings["engine.gpu_memory_utilization"] == 0.9 and settings["engine.num_engines"] == 2
    tp = build_serve_plan(compose_run_config(["engine=vllm_tp2", "hardware=2xh200", "model=qwen2_5_1_5b"]))
    assert [e.gpus for e in tp.engines] == [(0, 1)]
    cpu = build_serve_plan(compose_run_config(["serve.data_parallel=3"]))
    assert len(cpu.engines) == 3 and plan_bundles(cpu).engines[2].num_cpus == 1.0
    assert {s.key: s.value for s in cpu.settings}["engine.max_model_len"] == 128


@pytest.mark.parametrize(("overrides", "token", "text"), [
    (["serve.host=0.0.0.0"], None, "serve.host=0.0.0.0 lets other machines reach the server, which then needs a "
     "bearer token: set RLGEN_SERVE_TOKEN"),
    (["engine=vllm", "hardware=1xh100", "serve.data_parallel=2"], None, "need 2 GPUs, and hardware=1xh100 has 1"),
    (["serve.port=0"], None, "serve.port=0 is not a TCP port"),
    (["engine=remote"], None, "engine=remote uses a server"),
    (["engine=vllm", "hardware=1xh100", "engine.engines_per_gpu=2"], None,
     "engine.engines_per_gpu=2 is for training runs; set engine.engines_per_gpu=1"),
])
def test_serve_plan_refusals(overrides, token, text):
    with pytest.raises(PlanError) as err:
        build_serve_plan(compose_run_config(overrides), token)
    assert any(text in p for p in err.value.problems), err.value.problems


@pytest.mark.parametrize(("key", "value", "sentence"), [
    ("max_queue", "0", "serve.max_queue=0 must be at least 1, such as serve.max_queue=256 (the default)."),
    ("max_sequences", "-3", "serve.max_sequences=-3 must be at least 1, such as serve.max_sequences=4096 (the "
     "default)."),
    ("data_parallel", "0", "serve.data_parallel=0 must be at least 1, such as serve.data_parallel=1 (the default)."),
    ("max_body_mb", "0", "serve.max_body_mb=0 must be a finite number above 0, such as serve.max_body_mb=64 (the "
     "default)."),
    ("request_timeout_s", "nan", "serve.request_timeout_s=nan must be a finite number above 0, such as "
     "serve.request_timeout_s=600 (the default)."),
    ("body_timeout_s", "-1", "serve.body_timeout_s=-1 must be a finite number above 0, such as "
     "serve.body_timeout_s=30 (the default)."),
    ("header_timeout_s", "inf", "serve.header_timeout_s=inf must be a finite number above 0, such as "
     "serve.header_timeout_s=30 (the default)."),
    ("port", "70000", "serve.port=70000 is not a TCP port; choose one in 1..65535, such as serve.port=8000."),
])
def test_a_serve_limit_out_of_range_is_named_alone(key, value, sentence):
    """The refusal names the one wrong value, its range and a value to type instead, not every limit there is."""
    with pytest.raises(PlanError) as err:
        build_serve_plan(compose_run_config([f"serve.{key}={value}"]))
    assert err.value.problems == [sentence]


@pytest.mark.parametrize(("overrides", "env", "text"), [
    (["serve.host=0.0.0.0"], "   ", "RLGEN_SERVE_TOKEN is set but blank (only whitespace), and no client could "
     "send it; set RLGEN_SERVE_TOKEN=<a secret>, or unset it"),
    ([], "\t ", "RLGEN_SERVE_TOKEN is set but blank"),  # on loopback too: every request would get 401
    (["serve.token='  '"], None, "serve.token is blank (only whitespace), and no client could send it; set "
     "serve.token=<a secret>"),
])
def test_a_blank_token_is_refused(monkeypatch, overrides, env, text):
    from rlgen.serve.checks import serve_token

    if env is None:
        monkeypatch.delenv("RLGEN_SERVE_TOKEN", raising=False)
    else:
        monkeypatch.setenv("RLGEN_SERVE_TOKEN", env)
    cfg = compose_run_config(overrides)
    with pytest.raises(PlanError) as err:
        build_serve_plan(cfg, serve_token(cfg))
    assert len(err.value.problems) == 1 and text in err.value.problems[0], err.value.problems


def test_a_token_allows_any_bind():
    assert build_serve_plan(compose_run_config(["serve.host=0.0.0.0"]), "tok").engines
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.2") and not is_loopback("example.org")
