"""`rlgen serve` in a subprocess on a free loopback port: rlgen's client generates and pushes weights, `rlgen
train engine=remote` learns against it as the embedded default does, and a run whose server goes away ends
with one sentence."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from helpers import assert_learned
from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime import RunError
from rlgen.runtime.run import run_training
from rlgen.wire.client import GenerationClient, ServerError

PROMPT = [5, 6, 7, 8]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, out: Path, *overrides: str, env: dict[str, str] | None = None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        out.mkdir(parents=True, exist_ok=True)
        self.log = out / "serve.out"
        cmd = [sys.executable, "-m", "rlgen.cli", "serve", f"serve.port={self.port}", f"hydra.run.dir={out}",
               *overrides]
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})})
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"rlgen serve exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                with GenerationClient(self.url, timeout_s=2, token=(env or {}).get("RLGEN_SERVE_TOKEN")) as c:
                    if c.health()["ok"]:
                        return
            except ServerError:
                time.sleep(0.5)
        self.stop()
        raise AssertionError(f"rlgen serve did not answer within 180 s: {self.log.read_text()}")

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve"), "serve.data_parallel=2")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()
    assert "server stopped (SIGINT)" in srv.log.read_text()


def test_client_generates_and_weight_pushes_change_outputs(server):
    with GenerationClient(server.url) as client:
        info = client.info()
        assert info["data_parallel"] == 2 and info["engine_kind"] == "hf" and info["model"] == "tiny"
        before = client.generate_ids([PROMPT], max_tokens=6, temperature=0.0, ignore_eos=True).completions[0]
        path = Path(info["model_path"])
        from safetensors.torch import load_file

        original = load_file(str(path / "model.safetensors"))
        gen = torch.Generator().manual_seed(0)
        client.update_weights({k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in original.items()}, 3)
        after = client.generate_ids([PROMPT], max_tokens=6, temperature=0.0, ignore_eos=True).completions[0]
        assert (before.version, after.version) == (0, 3)
        assert after.logprobs != before.logprobs
        client.update_weights(original, 0)
        back = client.generate_ids([PROMPT], max_tokens=6, temperature=0.0, ignore_eos=True).completions[0]
        assert back.token_ids == before.token_ids
        assert back.logprobs == pytest.approx(before.logprobs, abs=1e-5)


def test_validate_checks_a_server_against_the_reference(server):
    """rlgen validate engine=remote passes on the server's own weights and fails once they are perturbed."""
    from safetensors.torch import load_file

    from rlgen.validate.run import run_validate

    cfg = compose_run_config(["engine=remote", f"engine.url={server.url}", "validate.cases=6"])
    assert run_validate(cfg).passed
    with GenerationClient(server.url) as client:
        original = load_file(str(Path(client.info()["model_path"]) / "model.safetensors"))
        gen = torch.Generator().manual_seed(1)
        client.update_weights({k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in original.items()}, 1)
        try:
            assert not run_validate(cfg).passed
        finally:
            client.update_weights(original, 0)


def test_validate_gives_a_server_an_adapter_by_name_and_leaves_its_policy(server, tmp_path):
    """rlgen validate engine=remote learner.lora.init=<adapter>: the server loads the adapter under a name for the
    check and unloads it after, so what it serves to other clients (its policy version) never changes; merged
    weights, which would replace the server's, are refused in one sentence."""
    pytest.importorskip("peft")
    from helpers import lora_export, lora_model
    from rlgen.adapter_folder import write_adapter
    from rlgen.plan import PlanError
    from rlgen.validate.run import run_validate

    with GenerationClient(server.url) as client:
        before = client.info()
    adapter = lora_export(lora_model(before["model_path"], seed=0))
    write_adapter(str(tmp_path), adapter["tensors"], adapter["config"])
    common = ["engine=remote", f"engine.url={server.url}", f"learner.lora.init={tmp_path}", "validate.cases=4"]
    report = run_validate(compose_run_config([*common, "learner.lora.sync=adapter"]))
    assert report.passed, report.rows
    assert "loaded by name (rlgen-candidate-" in report.candidate and "unloaded after" in report.candidate
    with GenerationClient(server.url) as client:
        after = client.info()
    assert after["adapters"] == [] and after["versions"] == before["versions"]
    assert after["weight_updates"] == before["weight_updates"]
    with pytest.raises(PlanError, match="would replace the weights the server at .* serves; use learner.lora.sync=adapter"):
        run_validate(compose_run_config([*common, "learner.lora.sync=merged"]))


# make test-all only; in make test: test_a_remote_run_matches_the_same_run_with_engines_of_its_own
@pytest.mark.long
@pytest.mark.slow
def test_train_engine_remote_learns_like_the_default(server, tmp_path):
    with GenerationClient(server.url) as client:
        updates_before = client.info()["weight_updates"]
    cfg = compose_run_config(["progress=false", "engine=remote", f"engine.url={server.url}"])
    summary = run_training(build_plan(cfg), tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(records) == cfg.steps
    assert_learned(records, summary)  # the margin the embedded default must learn by
    assert records[-1]["version"] == cfg.steps and all(r["staleness"] == 0 for r in records)
    engines = {s["actor"] for r in records for s in r["timeline"] if s["phase"] == "generate"}
    assert engines == {"engine0", "engine1"}  # the balancer sees the server's two engines
    with GenerationClient(server.url) as client:
        info = client.info()
    # the starting weights, then one update per step, to each of the server's two engines
    assert info["weight_updates"] - updates_before == 2 * (cfg.steps + 1)
    assert info["versions"] == [cfg.steps, cfg.steps]


def test_a_remote_run_matches_the_same_run_with_engines_of_its_own(server, tmp_path):
    """Same seed, same two engines: the server's, or the run's own. Every step's rollouts, rewards and losses
    agree exactly, so engine=remote changes where generation happens and nothing else."""
    common = ["progress=false", "steps=25", "checkpoint.every=0"]
    run_training(build_plan(compose_run_config([*common, "engine=remote", f"engine.url={server.url}"])), tmp_path / "remote")
    run_training(build_plan(compose_run_config([*common, "engine.num_engines=2"])), tmp_path / "own")
    remote, own = (read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("remote", "own"))
    keys = ("reward_mean", "loss", "response_tokens", "mismatch/k3_kl")
    assert [[r[k] for k in keys] for r in remote] == [[r[k] for k in keys] for r in own]


def test_a_run_whose_server_goes_away_ends_with_one_sentence(tmp_path):
    srv = Server(tmp_path / "srv")
    cfg = compose_run_config(["progress=false", "engine=remote", f"engine.url={srv.url}", "steps=2000",
                              "timeout_s=60"])
    box: dict = {}

    def run() -> None:
        try:
            run_training(build_plan(cfg), tmp_path / "run")
        except BaseException as err:  # noqa: BLE001 - examined below
            box["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.5)
    srv.stop(signal.SIGKILL)
    thread.join(120)
    assert not thread.is_alive(), "the run did not end after its server died"
    err = box.get("error")
    assert isinstance(err, RunError), repr(err)
    assert f"no answer from the rlgen server at {srv.url}" in str(err)
    assert "check that `rlgen serve` is running there" in str(err)


def test_serve_refuses_a_public_bind_without_a_token():
    env = {k: v for k, v in os.environ.items() if k != "RLGEN_SERVE_TOKEN"}
    res = subprocess.run([sys.executable, "-m", "rlgen.cli", "serve", "serve.host=0.0.0.0"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode == 2
    assert "serve.host=0.0.0.0 lets other machines reach the server, which then needs a bearer token" in res.stderr
    assert "Traceback" not in res.stderr


def test_serve_refuses_a_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "rlgen.cli", "serve", f"serve.port={port}"], capture_output=True,
                             text=True, timeout=120)
    assert res.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in res.stderr and "choose another serve.port" in res.stderr


def test_a_token_server_answers_only_with_the_token(tmp_path):
    srv = Server(tmp_path, "serve.host=0.0.0.0", env={"RLGEN_SERVE_TOKEN": "s3cret"})
    try:
        with GenerationClient(srv.url) as anonymous:
            assert anonymous.health()["ok"]
            with pytest.raises(ServerError, match="bearer token"):
                anonymous.generate_ids([PROMPT])
        with GenerationClient(srv.url, token="s3cret") as client:
            assert len(client.generate_ids([PROMPT], n=2).completions) == 2
    finally:
        srv.stop(signal.SIGTERM)
