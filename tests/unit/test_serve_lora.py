"""LoRA adapters on `rlgen serve`, over in-process hf engines through rlgen's client: adapters loaded and unloaded
by name (/v1/load_lora_adapter, /v1/unload_lora_adapter) and picked per request (/generate's adapter,
/v1/completions' model), a trainer's policy adapter (/weights/adapter), and the one-sentence refusals."""

from __future__ import annotations

import dataclasses

import pytest
from fastapi.testclient import TestClient

from helpers import lora_export, lora_model
from rlgen.adapter_folder import write_adapter
from rlgen.config import EngineConfig
from rlgen.config.compose import compose_run_config
from rlgen.engines.hf.engine import HFEngine
from rlgen.models import load_tokenizer, prepare_model
from rlgen.plan import build_plan
from rlgen.serve.app import make_app
from rlgen.serve.pool import EnginePool, ServedModel
from rlgen.wire.client import GenerationClient, ServerError

pytest.importorskip("peft")

PROMPT = [5, 6, 7, 8]
GREEDY = {"n": 1, "max_tokens": 6, "temperature": 0.0, "ignore_eos": True}


def _adapter(base_dir, seed, rank=4):
    return lora_export(lora_model(base_dir, seed, rank))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    cfg = compose_run_config([])
    path = prepare_model(cfg)
    plan = build_plan(cfg)
    model = ServedModel("tiny", path, plan.model.params, plan.model.vocab_size, 64, "hf", 1, load_tokenizer(path),
                        adapters=True, max_lora_rank=8, config=cfg.model)
    folders = tmp_path_factory.mktemp("adapters")
    for name, seed, rank in (("style", 1, 4), ("other", 2, 4), ("wide", 3, 16)):
        a = _adapter(path, seed, rank)
        write_adapter(str(folders / name), a["tensors"], a["config"])
    foreign = compose_run_config(["model.hidden_size=32", "model.intermediate_size=64"])
    foreign_path = prepare_model(foreign)
    a = _adapter(foreign_path, 4)
    write_adapter(str(folders / "foreign"), a["tensors"], a["config"])
    return path, model, folders


def _client(setup, **model_changes):
    path, model, _ = setup
    engines = [HFEngine(path, EngineConfig(dtype="float32"), seed=i, name=f"engine{i}") for i in range(2)]
    pool = EnginePool(engines, dataclasses.replace(model, **model_changes), timeout_s=60, local=True)
    app = make_app(pool, token=None, max_sequences=64, max_body_mb=1.0)
    client = GenerationClient("http://testserver")
    client._http = TestClient(app, base_url="http://testserver")
    return client


def _tokens(client, **kw):
    """Greedy tokens and their logprobs (the tiny random model repeats tokens; the logprobs tell adapters apart)."""
    return [(c.token_ids, [round(x, 5) for x in c.logprobs])
            for c in client.generate_ids([PROMPT, [9, 10, 11]], **GREEDY, **kw).completions]


def test_named_adapters_load_pick_and_unload(setup):
    _, _, folders = setup
    client = _client(setup)
    base = _tokens(client)
    assert client.load_lora_adapter("style", str(folders / "style"))["adapters"] == ["style"]
    client.load_lora_adapter("other", str(folders / "other"))
    info = client.info()
    assert info["adapters"] == ["other", "style"] and "adapter" in info["weights_over"] and info["max_lora_rank"] == 8
    style, other = _tokens(client, adapter="style"), _tokens(client, adapter="other")
    assert style != base and other != base and style != other
    assert _tokens(client) == base  # a request that names no adapter runs on the base
    one = client.generate_ids([PROMPT], **GREEDY, adapter="style").completions[0]
    assert (one.token_ids, [round(x, 5) for x in one.logprobs]) == style[0]

    text = client.complete("3+4=", model="style", max_tokens=4, temperature=0.0)
    assert text["model"] == "style"
    with pytest.raises(ServerError, match="model='nope' is not served here") as err:
        client.complete("3+4=", model="nope", max_tokens=4)
    assert err.value.status == 404

    assert client.unload_lora_adapter("style")["adapters"] == ["other"]
    with pytest.raises(ServerError, match="no adapter named 'style' is loaded") as err:
        client.generate_ids([PROMPT], adapter="style")
    assert err.value.status == 404
    # load_inplace replaces an adapter of that name
    client.load_lora_adapter("other", str(folders / "style"), load_inplace=True)
    assert _tokens(client, adapter="other") == style


def test_bad_adapter_requests_get_one_sentence(setup, tmp_path):
    _, _, folders = setup
    client = _client(setup)
    client.load_lora_adapter("style", str(folders / "style"))
    cases = [
        (lambda: client.load_lora_adapter("style", str(folders / "other")), 400, "is loaded already"),
        (lambda: client.unload_lora_adapter("ghost"), 404, r"no adapter named 'ghost' is loaded; loaded: \['style'\]"),
        (lambda: client.load_lora_adapter("x", str(tmp_path)), 400, "is not a PEFT adapter folder"),
        (lambda: client.load_lora_adapter("x", str(folders / "foreign")), 400, "holds an adapter for another base"),
        (lambda: client.load_lora_adapter("x", str(folders / "wide")), 400, "rank 16, over this server's "
                                                                            "engine.max_lora_rank=8"),
        (lambda: client.load_lora_adapter("tiny", str(folders / "other")), 400, "the served model's own name"),
    ]
    for call, status, text in cases:
        with pytest.raises(ServerError, match=text) as err:
            call()
        assert err.value.status == status, text
    assert client.info()["adapters"] == ["style"]  # nothing changed
    without = _client(setup, adapters=False)
    with pytest.raises(ServerError, match="started without LoRA; restart `rlgen serve` with engine.max_lora_rank") as err:
        without.load_lora_adapter("style", str(folders / "style"))
    assert err.value.status == 409


def test_a_trainers_policy_adapter_becomes_the_policy(setup):
    path, _, _ = setup
    client = _client(setup)
    base = _tokens(client)
    res = client.update_adapter(_adapter(path, 7), version=5)
    assert res["version"] == 5 and res["engines"] == [0, 1]
    out = client.generate_ids([PROMPT, [9, 10, 11]], **GREEDY)
    assert [c.token_ids for c in out.completions] != base and {c.version for c in out.completions} == {5}
    client.update_adapter(_adapter(path, 8), version=6, engine=1)
    assert client.info()["versions"] == [5, 6]
    with pytest.raises(ServerError, match="rank 16, over this server's engine.max_lora_rank=8"):
        client.update_adapter(_adapter(path, 9, rank=16), version=7)
