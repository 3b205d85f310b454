"""The NCCL weight path of engine=remote, wired end to end on CPU: the run's VllmNcclTransport drives remote-engine
actors, which drive a server's vllm engines over HTTP. The engines and the learner are stand-ins that record
what they are asked (NCCL itself needs GPUs); what is checked is every hop between them: the group's ranks and
address, the paused update, and the versions the server then reports."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from rlgen.config import EngineConfig
from rlgen.serve.app import make_app
from rlgen.serve.pool import EnginePool, ServedModel
from rlgen.sync.transports import VllmNcclTransport
from rlgen.wire.client import GenerationClient

ray = pytest.importorskip("ray")


class FakeVLLMEngine:
    """Records the weight-transfer calls a vLLM engine gets."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def init_weight_transfer(self, init_info: dict, timeout_s: float) -> dict:
        self.calls.append(("init", dict(init_info)))
        return {"ok": True}

    def receive_weights(self, update_info: dict, version: int, timeout_s: float, *, pause: bool = False) -> dict:
        self.calls.append(("receive", update_info["names"], version))
        return {"version": version, "spans": [("sync", time.time(), time.time())]}

    def pause(self, mode: str, clear_cache: bool) -> None:
        self.calls.append(("pause", mode))

    def resume(self) -> None:
        self.calls.append(("resume",))

    def health(self) -> dict:
        return {"ok": True}


@ray.remote
class FakeLearner:
    """Rank 0's side of the NCCL path, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def weight_meta(self, dtype: str) -> dict:
        return {"names": ["w"], "dtype_names": [dtype], "shapes": [[4]], "max_tensor_bytes": 8, "total_bytes": 8}

    def sync_endpoint(self) -> tuple[str, int]:
        return "10.1.2.3", 29555

    def init_nccl_sender(self, addr: str, port: int, world: int, timeout_s: float) -> dict:
        self.calls.append(("init", addr, port, world))
        return {"ok": True}

    def send_weights_nccl(self, version: int, dtype: str, bucket: int, timeout_s: float) -> dict:
        self.calls.append(("send", version))
        return {"actor": "learner0", "version": version, "spans": []}

    def recorded(self) -> list[tuple]:
        return self.calls


@pytest.fixture(scope="module")
def server():
    import uvicorn

    engines = [FakeVLLMEngine(), FakeVLLMEngine()]
    model = ServedModel("fake", "/nowhere", 1, 8, 64, "vllm", 2, nccl_weights=True, pauses=True)
    app = make_app(EnginePool(engines, model, timeout_s=30.0, local=True), token=None, max_sequences=8, max_body_mb=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", engines
    srv.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def ray_local():
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_nccl_transport_through_remote_engines(server, ray_local):
    from rlgen.engines.remote.engine import RemoteEngine

    url, engines = server
    cfg = EngineConfig(kind="remote", url=url)
    proxies = [ray.remote(RemoteEngine).options(max_concurrency=4).remote(None, cfg, name=f"engine{i}")
               for i in range(2)]
    learner = FakeLearner.remote()
    transport = VllmNcclTransport(timeout_s=30.0, tp_sizes=[2, 2])
    transport.setup(learner, proxies, ["engine0", "engine1"])
    # one group: the learner is rank 0, each TP-2 engine's workers follow (offsets 1 and 3), five ranks in all
    assert [c for c in engines[0].calls if c[0] == "init"] == [
        ("init", {"master_address": "10.1.2.3", "master_port": 29555, "rank_offset": 1, "world_size": 5})]
    assert engines[1].calls[0][1]["rank_offset"] == 3
    assert ray.get(learner.recorded.remote())[0] == ("init", "10.1.2.3", 29555, 5)

    result = transport.push(1, in_flight=True)  # in flight: paused, received, resumed
    assert result.version == 1 and transport.version == 1
    for e in engines:
        assert [c[0] for c in e.calls[1:]] == ["pause", "receive", "resume"]
        assert e.calls[2] == ("receive", ["w"], 1)
    assert ray.get(learner.recorded.remote())[1] == ("send", 1)
    assert {r["actor"] for r in result.results} == {"engine0", "engine1", "learner0"}
    with GenerationClient(url) as client:
        info = client.info()
    assert info["versions"] == [1, 1] and info["paused"] == [False, False]

    transport.resend()  # the starting weights of a run that joins this server: the same version again
    assert [c for c in engines[0].calls if c[0] == "receive"][-1] == ("receive", ["w"], 1)
