"""LoRA against a running `rlgen serve`: `rlgen train engine=remote` with LoRA sends adapters (not whole weights) to
the server, which generates with them, and the run learns; a server started without LoRA gets merged weights,
or one sentence when adapters are asked for."""

from __future__ import annotations

import pytest
from test_serve_remote import Server

from helpers import assert_learned
from rlgen.config import Transport
from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import PlanError, build_plan
from rlgen.runtime.run import run_training
from rlgen.wire.client import GenerationClient

pytest.importorskip("peft")


# make test-all only; in make test: adapters to a server: test_serve_remote's validate-by-name; LoRA learning:
# test_lora_cpu
@pytest.mark.long
def test_a_remote_lora_run_sends_adapters_and_learns(tmp_path):
    srv = Server(tmp_path / "srv")
    try:
        cfg = compose_run_config(["progress=false", "engine=remote", f"engine.url={srv.url}", "learner.lora.rank=8"])
        plan = build_plan(cfg)
        assert plan.transport is Transport.lora_adapter  # a server's hf engines take adapters: megabytes over HTTP
        summary = run_training(plan, tmp_path / "run")
        records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
        assert_learned(records, summary, min_gain=0.1)
        # the server generated with the learner's adapter: engine and learner logprobs agree as in a local run
        assert max(r["mismatch/mean_abs_delta"] for r in records) < 1e-4
        with GenerationClient(srv.url) as client:
            info = client.info()
        assert info["versions"] == [cfg.steps] and info["weight_updates"] == cfg.steps + 1
    finally:
        assert srv.stop() == 0, srv.log.read_text()


def test_a_server_without_lora_gets_merged_weights_or_one_sentence(tmp_path):
    srv = Server(tmp_path / "srv", "engine.max_lora_rank=0")
    try:
        common = ["engine=remote", f"engine.url={srv.url}", "learner.lora.rank=8"]
        plan = build_plan(compose_run_config(common))
        assert plan.config.learner.lora.sync == "merged" and plan.transport is Transport.http
        with pytest.raises(PlanError, match=f"the server at {srv.url} was started without LoRA \\(restart it with "
                                            "engine.max_lora_rank=8 or more"):
            build_plan(compose_run_config([*common, "learner.lora.sync=adapter"]))
    finally:
        assert srv.stop() == 0, srv.log.read_text()
