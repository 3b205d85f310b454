"""An engine that dies inside an NCCL weight update, on CPU with Ray: the learner's broadcast, which NCCL would keep
blocked on the missing peer, is freed by abort_weight_group() in its "control" concurrency group; an engine still
waiting inside the broadcast is stopped; a new group forms with the re-created engines and the update goes
through. The NCCL calls themselves are stand-ins (they need GPUs); the GPU record is in docs/benchmarks.md."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from rlgen.sync.sender import CONTROL_GROUP, WeightSender
from rlgen.sync.transports import VllmNcclTransport
from rlgen.sync.waits import SyncError

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class StandInGroup:
    """vLLM's PyNcclCommunicator as the learner holds it: destroy() aborts it, freeing a blocked broadcast."""

    def __init__(self) -> None:
        self.aborted = threading.Event()

    def destroy(self) -> None:
        self.aborted.set()


class BlockingLearner(WeightSender):
    """Rank 0: its broadcast blocks until every engine takes part, as NCCL's does, or until the group is aborted."""

    version, name, device = 0, "learner0", "cpu"

    def __init__(self) -> None:
        self.inits: list[int] = []
        self.sent: list[int] = []
        self.block = True

    def weight_meta(self, dtype: str) -> dict:
        return {"names": ["w"], "dtype_names": [dtype], "shapes": [[4]], "max_tensor_bytes": 8, "total_bytes": 8}

    def sync_endpoint(self) -> tuple[str, int]:
        return "127.0.0.1", 29555 + len(self.inits)

    def init_nccl_sender(self, addr: str, port: int, world: int, timeout_s: float) -> dict:
        self._nccl_group = StandInGroup()
        self.inits.append(world)
        return {"ok": True}

    def send_weights_nccl(self, version: int, dtype: str, bucket: int, timeout_s: float) -> dict:
        group = self._nccl_group
        if self.block and not group.aborted.wait(timeout_s):
            raise SyncError("the stand-in broadcast was never freed")
        if self._nccl_group is not group:
            raise SyncError(f"{self.name}: the NCCL broadcast of version {version} was aborted")
        self.sent.append(version)
        return {"actor": self.name, "version": version, "spans": []}

    def unblock(self) -> None:
        self.block = False

    def recorded(self) -> tuple[list[int], list[int]]:
        return self.inits, self.sent


class Engine:
    """An NCCL-fed engine; ``fate``: "dies" exits inside receive_weights, "waits" stays inside it (its peer is
    gone), anything else receives."""

    def __init__(self, name: str, fate: str = "") -> None:
        self.name, self.fate = name, fate

    def init_weight_transfer(self, info: dict, timeout_s: float) -> dict:
        return {"ok": True}

    def receive_weights(self, update_info: dict, version: int, timeout_s: float, *, pause: bool = False) -> dict:
        if self.fate == "dies":
            os._exit(1)
        if self.fate == "waits":
            time.sleep(3600)
        return {"actor": self.name, "version": version, "spans": []}

    def pause(self, mode: str, clear_cache: bool) -> None: ...

    def resume(self) -> None: ...

    def health(self) -> dict:
        return {"ok": True}


@pytest.fixture(scope="module")
def ray_local():
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _engine(name: str, fate: str = "") -> object:
    return ray.remote(Engine).options(max_concurrency=4, num_cpus=0).remote(name, fate)


def _stops_within(engine: object, seconds: float) -> bool:
    """ray.kill() only asks Ray to stop the actor: a call sent just after it may still be answered by the threaded
    actor, so the engine counts as stopped once a call fails with RayActorError within ``seconds``."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            ray.get(engine.health.remote(), timeout=max(0.1, deadline - time.time()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        time.sleep(0.2)
    return False


def test_an_engine_dying_inside_an_nccl_update_frees_the_learner_and_a_new_group_forms(ray_local):
    learner = ray.remote(concurrency_groups={CONTROL_GROUP: 1})(BlockingLearner).options(num_cpus=0).remote()
    engines = [_engine("engine0", "dies"), _engine("engine1", "waits")]
    transport = VllmNcclTransport(timeout_s=60.0)
    transport.setup(learner, engines, ["engine0", "engine1"])

    t0 = time.time()
    with pytest.raises(Exception) as info:
        transport.push(1)
    assert time.time() - t0 < 45, "the failed update must not wait out the transport's 60 s timeout"
    assert isinstance(info.value, ray.exceptions.RayActorError)
    assert transport.broken is None, "the learner came free, so the transport can form a new group"
    for engine in engines:  # the dead one, and the one left inside the broadcast, which was stopped
        assert _stops_within(engine, 30.0)

    ray.get(learner.unblock.remote())
    transport.replace_engine(0, _engine("engine0"), resend=False)  # no group yet: engine1 is still to come
    transport.replace_engine(1, _engine("engine1"), resend=False)
    assert transport.push(1, resend=True).version == 1
    inits, sent = ray.get(learner.recorded.remote())
    assert inits == [3, 3] and sent == [1]  # the first group, one new group once both are back, then the update
