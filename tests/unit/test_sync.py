"""Weight transports on CPU: buckets, timeouts, version bookkeeping, and the order of every actor call.

Actors are stand-ins behind ``Handle``, which gives each object Ray's calling convention
(``handle.method.remote(...)`` returns a future; futures passed as arguments are resolved first) and runs
each actor's calls on its own threads. NCCL's rendezvous is modelled with barriers, so a transport that
does not run the two sides concurrently deadlocks here and fails on its timeout. The real vLLM transfer
engines run in tests/gpu/test_weight_sync.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlgen.config.compose import compose_run_config
from rlgen.engines.contract import CapabilityMissing, ReceivesNccl
from rlgen.engines.vllm.args import engine_args_for
from rlgen.plan import Transport, build_plan
from rlgen.runtime.start.transport import (
    TRANSPORTS,
    TransportSpec,
    make_transport,
    register_transport,
    transport_spec,
)
from rlgen.sync.ipc_buffer import ALIGN_BYTES, buffer_bytes, chunk_views, ipc_layout, part_for
from rlgen.sync.layout import plan_buckets
from rlgen.sync.sender import WeightSender
from rlgen.sync.transports import (
    CudaIpcTransport,
    ObjectStoreTransport,
    VllmNcclTransport,
)
from rlgen.sync.waits import SyncError, SyncTimeoutError, get_all, run_with_timeout


class Handle:
    def __init__(self, obj, concurrency: int = 2):
        self._obj, self._pool = obj, ThreadPoolExecutor(max_workers=concurrency)

    def __getattr__(self, name):
        method, pool = getattr(self._obj, name), self._pool

        class Remote:
            @staticmethod
            def remote(*args, **kwargs):
                args = [a.result() if isinstance(a, Future) else a for a in args]
                return pool.submit(method, *args, **kwargs)

        return Remote()


class FakeEngine:
    def __init__(self, name, log, rendezvous=None, hang=False, gpus=("gpu0",)):
        self.name, self.log, self.rendezvous, self.hang, self.gpus = name, log, rendezvous, hang, list(gpus)
        self.version, self.weights, self.joined = 0, None, None

    def _note(self, what):
        self.log.append((self.name, what))

    def update_weights(self, weights, version):
        self._note("update_weights")
        self.weights, self.version = weights, version
        return {"version": version, "spans": [("sync", 0.0, 1.0)]}

    def init_weight_transfer(self, info, timeout_s):
        self._note("init")
        self.joined = info
        if info:
            self.rendezvous.wait(timeout=5)
        return {"actor": self.name, "spans": []}

    def receive_weights(self, update_info, version, timeout_s, *, pause=False):
        """pause=True: the engine pauses its requests around the receive itself (tested on the vLLM engine in
        tests/gpu/test_vllm_cpu_side.py), so the stand-in only notes that it was asked to."""
        self._note("receive:pause" if pause else "receive")
        if self.hang:
            time.sleep(3)
        self.rendezvous.wait(timeout=5)  # the broadcast needs the learner sending at the same time
        self.version = version
        return {"actor": self.name, "version": version, "spans": [("sync", 0.0, 1.0)]}

    def receive_ipc(self, handle, chunk, version, *, first=True, last=True, pause=False, timeout_s=1.0):
        """Reads the learners' buffers the way its workers do, each from its own GPU's part of the handle (the
        stand-in parts hold the tensors themselves); every worker must find the same weights."""
        t0 = time.time()
        if first and pause:
            self.pause("keep", False)
        self._note("ipc")
        if self.hang:
            raise RuntimeError("the worker failed")
        if first:
            self.received = {}
        views = [dict(chunk_views(part_for(handle, gpu)["buffer"], chunk)) for gpu in self.gpus]
        assert all(set(v) == set(views[0]) and all(torch.equal(v[n], views[0][n]) for n in v) for v in views)
        self.received.update({n: t.clone() for n, t in views[0].items()})
        self.buffers = getattr(self, "buffers", set()) | {id(part_for(handle, g)["buffer"]) for g in self.gpus}
        out = {"actor": self.name, "version": self.version, "spans": [("sync", t0, time.time())]}
        if last:
            self.version = out["version"] = version
            if pause:
                self.resume()
        return out

    def start_weight_update(self, timeout_s):
        self._note("start")

    def pause(self, mode, clear_cache):
        self._note(f"pause:{mode}")

    def resume(self):
        self._note("resume")

    def sleep(self, level):
        self._note(f"sleep:{level}")

    def wake(self, tags=None):
        self._note(f"wake:{','.join(tags or [])}")


class FakeLearner(WeightSender):
    """WeightSender's pure parts over a real torch model; the vllm-backed sends are stood in for."""

    def __init__(self, log, rendezvous=None):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
        self.version, self.name, self.device, self.log, self.rendezvous = 0, "learner0", "cpu", log, rendezvous

    def get_weights(self):
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def sync_endpoint(self):
        return "10.0.0.1", 12345

    def init_nccl_sender(self, addr, port, world, timeout_s):
        self.log.append(("learner0", f"init:{world}"))
        self.rendezvous.wait(timeout=5)
        return {"actor": "learner0", "spans": []}

    def send_weights_nccl(self, version, dtype, bucket_bytes, timeout_s):
        self._check_send(version)
        self.log.append(("learner0", f"send:{bucket_bytes}"))
        self.rendezvous.wait(timeout=5)
        return {"actor": "learner0", "version": version, "spans": []}

    def _share_ipc(self, buffer):
        return {"gpu": getattr(self, "gpu", "gpu0"), "buffer": buffer}  # in one process: the tensor itself


def plan_of(*overrides):
    return build_plan(compose_run_config(list(overrides)))


# -- pure helpers -----------------------------------------------------------------------------------------------
@given(st.lists(st.integers(0, 100), max_size=40), st.integers(1, 120))
def test_buckets_cover_every_tensor_once_in_order_within_the_bound(sizes, bound):
    buckets = plan_buckets(sizes, bound)
    assert [i for b in buckets for i in b] == list(range(len(sizes)))
    for b in buckets:
        total = sum(sizes[i] for i in b)
        assert total <= bound or len(b) == 1  # only a tensor larger than the bound travels alone
    for a, b in zip(buckets, buckets[1:]):  # greedy: the next tensor did not fit
        assert sum(sizes[i] for i in a) + sizes[b[0]] > bound


def test_bucket_bound_must_be_positive():
    with pytest.raises(ValueError):
        plan_buckets([1], 0)


def test_run_with_timeout_returns_raises_and_gives_up():
    assert run_with_timeout(lambda: 7, 1.0, "x") == 7
    with pytest.raises(KeyError):
        run_with_timeout(lambda: {}["k"], 1.0, "x")
    stop = threading.Event()
    t0 = time.time()
    with pytest.raises(SyncTimeoutError, match="NCCL broadcast did not finish within 0 s.*restart the run"):
        run_with_timeout(lambda: stop.wait(10), 0.2, "NCCL broadcast")
    assert time.time() - t0 < 2
    stop.set()


def test_get_all_names_the_calls_that_did_not_answer():
    pool = ThreadPoolExecutor(2)
    fast, slow = pool.submit(lambda: 1), pool.submit(time.sleep, 2)
    with pytest.raises(SyncTimeoutError, match="engine1"):
        get_all([fast, slow], 0.2, "update", ["engine0", "engine1"])
    assert get_all([fast], 1.0, "update") == [1]
    assert get_all([fast], 1.0, "update", fetch=False) == []
    failed = pool.submit(lambda: 1 / 0)
    t0 = time.time()
    with pytest.raises(ZeroDivisionError):
        get_all([pool.submit(time.sleep, 1), failed], 5.0, "update")
    assert time.time() - t0 < 0.9


def test_engine_args_and_transport_choice_follow_the_plan():
    assert engine_args_for(Transport.nccl) == {"weight_transfer_config": {"backend": "nccl"}}
    assert engine_args_for(Transport.cuda_ipc) == {"weight_transfer_config": {"backend": "ipc"}}
    assert engine_args_for(Transport.ray_object_store) == {}
    cfg = compose_run_config(["engine=vllm", "hardware=2xh200", "hardware.colocated=false"])
    t = make_transport(build_plan(cfg), cfg, bucket_mb=64)
    assert isinstance(t, VllmNcclTransport) and t.bucket_bytes == 64 << 20 and t.dtype == "bfloat16"
    cfg = compose_run_config(["engine=vllm", "hardware=1xh100", "engine.gpu_memory_utilization=0.4"])
    assert isinstance(make_transport(build_plan(cfg), cfg, sleep_level=2), CudaIpcTransport)
    cfg = compose_run_config([])
    assert isinstance(make_transport(build_plan(cfg), cfg), ObjectStoreTransport)
    cfg = compose_run_config(["engine=vllm_tp2", "hardware=8xh100", "hardware.engine_gpus=4"])
    assert make_transport(build_plan(cfg), cfg).tp_sizes == [2] * len(build_plan(cfg).engines)


def test_a_transport_needs_the_capability_it_calls():
    """make_transport refuses a weight path the engine kind does not claim (rlgen.engines.contract), and an update
    in flight refuses engines that do not pause."""
    cfg = compose_run_config([])  # hf engines: no NCCL receiving, no pausing
    plan = build_plan(cfg)
    with pytest.raises(CapabilityMissing, match="ReceivesNccl"):
        make_transport(dataclasses.replace(plan, transport=Transport.nccl), cfg)
    assert make_transport(plan, cfg).pauses is False
    cfg = compose_run_config(["engine=vllm", "hardware=2xh200"])
    t = make_transport(build_plan(cfg), cfg)
    assert t.pauses is True
    t.pauses = False
    with pytest.raises(SyncError, match="PausesInFlight"):
        t._pause_kwargs(True)
    assert t._pause_kwargs(False) == {}


def test_every_weight_path_the_plan_names_has_a_spec_and_a_new_one_plugs_in(monkeypatch):
    """The transport table: one spec per plan.transport, with the capability its path calls; a path registered
    from code is built by make_transport from its spec, its capability checked first."""
    assert set(TRANSPORTS) == set(Transport)
    assert transport_spec("nccl").needs.__name__ == "ReceivesNccl"
    assert transport_spec(Transport.ray_object_store).needs is None
    with pytest.raises(LookupError, match="registered: "):
        transport_spec("carrier_pigeon")
    built = []

    class Own(ObjectStoreTransport):
        pass

    def build(plan, shared, sleep_level):
        built.append((shared["dtype"], sleep_level))
        return Own(**shared)

    monkeypatch.setitem(TRANSPORTS, Transport.ray_object_store, TRANSPORTS[Transport.ray_object_store])
    register_transport(TransportSpec(Transport.ray_object_store, None, "weights by our own path", build))
    cfg = compose_run_config([])
    assert isinstance(make_transport(build_plan(cfg), cfg, sleep_level=2), Own)
    assert built == [(str(build_plan(cfg).config.engine.dtype), 2)]
    register_transport(TransportSpec(Transport.ray_object_store, ReceivesNccl, "weights by our own path", build))
    with pytest.raises(CapabilityMissing, match="weights by our own path needs engines with ReceivesNccl"):
        make_transport(build_plan(cfg), cfg)


def test_weight_meta_and_iter_weights_round_trip():
    learner = FakeLearner([])
    meta = learner.weight_meta("bfloat16")
    assert meta["names"] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert meta["shapes"] == [[8, 4], [8], [2, 8], [2]] and set(meta["dtype_names"]) == {"bfloat16"}
    assert meta["max_tensor_bytes"] == 64 and meta["total_bytes"] == 2 * (32 + 8 + 16 + 2)
    state = dict(learner.model.named_parameters())
    got = list(learner.iter_weights())
    assert [n for n, _ in got] == list(state) and all(torch.equal(t, state[n]) for n, t in got)
    assert all(t.dtype == torch.bfloat16 for _, t in learner.iter_weights("bfloat16"))


def test_sender_refuses_a_version_it_does_not_hold():
    learner = FakeLearner([])
    learner.version = 3
    learner._check_send(3)
    with pytest.raises(SyncError, match="asked to send policy version 2.*at version 3"):
        learner._check_send(2)


# -- transports -------------------------------------------------------------------------------------------------
def test_object_store_queues_updates_without_waiting():
    log = []
    learner, engines = Handle(FakeLearner(log)), [FakeEngine("engine0", log), FakeEngine("engine1", log)]
    t = ObjectStoreTransport(timeout_s=5)
    t.setup(learner, [Handle(e) for e in engines], ["engine0", "engine1"])
    res = t.push(1)
    assert res.version == 1 and len(res.pending) == 2 and res.results[0]["actor"] == "learner0"
    assert [r["version"] for r in get_all(res.pending, 5, "updates")] == [1, 1]
    assert all(set(e.weights) == {"0.weight", "0.bias", "1.weight", "1.bias"} for e in engines)
    with pytest.raises(SyncError, match="not newer"):
        t.push(1)


def test_object_store_gives_a_re_created_engine_each_version_s_own_weights():
    """The learner may already hold the next version's weights (it trains while a flight generated ahead is looked
    at): an engine re-created at version 1 gets version 1's weights, and for a flight launched at version 0 it
    goes back to version 0, generates, and then takes version 1 again."""
    log = []
    learner = FakeLearner(log)
    t = ObjectStoreTransport(timeout_s=5, history=2)
    t.setup(Handle(learner), [Handle(FakeEngine("engine0", log))], ["engine0"])
    v0 = t.sent[0].result()["0.weight"].clone()
    with torch.no_grad():
        learner.model[0].weight.add_(1.0)  # trained to version 1
    get_all(t.push(1).pending, 5, "the update")
    v1 = learner.get_weights()["0.weight"]
    with torch.no_grad():
        learner.model[0].weight.add_(1.0)  # and on, to what will be version 2
    new = FakeEngine("engine0", log)
    t.replace_engine(0, Handle(new))
    assert new.version == 1 and torch.equal(new.weights["0.weight"], v1)
    seen = []
    _, later = t.generate_at(0, 0, lambda: seen.append((new.version, new.weights["0.weight"].clone())))
    get_all(later, 5, "taking version 1 again")
    assert seen[0][0] == 0 and torch.equal(seen[0][1], v0)
    assert new.version == 1 and torch.equal(new.weights["0.weight"], v1)
    assert t.generate_at(0, 1, lambda: "now")[0] == "now"  # a flight of the current version: nothing to rewind


def nccl_setup(tp_sizes=(1, 2), hang=False):
    log = []
    barrier = threading.Barrier(len(tp_sizes) + 1)
    engines = [FakeEngine(f"engine{i}", log, barrier, hang=hang and i == 1) for i in range(len(tp_sizes))]
    learner = FakeLearner(log, barrier)
    t = VllmNcclTransport(timeout_s=1.0, bucket_bytes=16, tp_sizes=tp_sizes)
    t.slack_s = 0.5
    t.setup(Handle(learner), [Handle(e) for e in engines], [e.name for e in engines])
    return t, engines, learner, log


def test_nccl_group_ranks_and_packed_update_info():
    t, engines, _, log = nccl_setup((1, 2))
    assert [e.joined["rank_offset"] for e in engines] == [1, 2]
    assert {e.joined["world_size"] for e in engines} == {4} and ("learner0", "init:4") in log
    assert t.bucket_bytes == 64  # raised from 16 to the largest tensor
    info = t.update_info
    assert info["packed"] is True and info["packed_buffer_size_bytes"] == 64 and info["packed_num_buffers"] == 2
    assert info["names"] == ["0.weight", "0.bias", "1.weight", "1.bias"] and info["shapes"][0] == [8, 4]


def test_nccl_push_runs_both_sides_together_and_tracks_versions():
    t, engines, learner, log = nccl_setup()
    log.clear()
    learner.version = 1
    res = t.push(1)
    assert t.version == 1 and all(e.version == 1 for e in engines)
    assert {r["actor"] for r in res.results} == {"engine0", "engine1", "learner0"}
    assert ("learner0", "send:64") in log and "pause:keep" not in {w for _, w in log}


def test_nccl_in_flight_update_asks_each_engine_to_pause_around_its_receive():
    """In flight, each engine pauses itself inside its receive call: no pause or resume round trips from the driver,
    and each engine's span is its own (the time it did not generate)."""
    t, engines, learner, log = nccl_setup()
    log.clear()
    learner.version = 1
    res = t.push(1, in_flight=True)
    for e in engines:
        mine = [w for n, w in log if n == e.name]
        assert mine == ["receive:pause"]
    assert {r["actor"]: r["spans"] for r in res.results if r["actor"].startswith("engine")} == {
        "engine0": [("sync", 0.0, 1.0)], "engine1": [("sync", 0.0, 1.0)]}


def test_nccl_timeout_names_the_engine_and_breaks_the_transport():
    t, engines, learner, _ = nccl_setup(hang=True)
    learner.version = 1
    with pytest.raises(SyncTimeoutError, match="engine1"):
        t.push(1)
    assert t.broken
    with pytest.raises(SyncError, match="broken.*restart the run"):
        t.push(2)


def test_ipc_cycle_sleeps_for_training_and_wakes_weights_before_kv():
    log = []
    engine = FakeEngine("engine0", log)
    learner = FakeLearner(log)
    t = CudaIpcTransport(timeout_s=2, sleep_level=2)
    t.setup(Handle(learner), [Handle(engine)], ["engine0"])
    spans = t.sleep_engines()
    assert spans[0]["actor"] == "engine0"
    learner.version = 1
    res = t.push(1)
    assert [w for n, w in log if n == "engine0"] == [
        "init", "sleep:2", "wake:weights", "ipc", "wake:kv_cache"]
    assert engine.version == 1 == t.version and {r["actor"] for r in res.results} == {"learner0", "engine0"}
    with pytest.raises(SyncError, match="async_steps=0.*cannot be in flight"):
        t.push(2, in_flight=True)


def test_ipc_start_sends_the_starting_weights_to_awake_engines():
    log = []
    engine, learner = FakeEngine("engine0", log), FakeLearner(log)
    t = CudaIpcTransport(timeout_s=2, sleep_level=1)
    t.setup(Handle(learner), [Handle(engine)], ["engine0"])
    log.clear()
    warm = t.start()  # before step 0 the engine is awake: no wake, no pause; the version stays
    assert [w for n, w in log if n == "engine0"] == ["ipc"]
    assert warm.version == 0 == t.version and warm.seconds >= 0


def test_awake_ipc_engines_never_sleep_and_pause_only_for_an_update_in_flight():
    log = []
    engines = [FakeEngine(f"engine{i}", log) for i in range(2)]
    learner = FakeLearner(log)
    t = CudaIpcTransport(timeout_s=2, sleep_level=1, awake=True)
    t.setup(Handle(learner), [Handle(e) for e in engines], [e.name for e in engines])
    log.clear()
    assert t.sleep_engines() == [] and t.wake_engines() == []
    learner.version = 1
    t.push(1)  # no generation running: load without pausing
    learner.version = 2
    t0 = time.time()
    res = t.push(2, in_flight=True)
    for e in engines:
        assert [w for n, w in log if n == e.name] == ["ipc", "pause:keep", "ipc", "resume"]
        assert e.version == 2
    # each engine's sync span is its whole pause: the time the update kept it from generating
    spans = {r["actor"]: r["spans"] for r in res.results}
    for name in ("engine0", "engine1"):
        [(phase, a, b)] = spans[name]
        assert phase == "sync" and t0 <= a <= b <= time.time()
    assert t.version == 2


def test_a_learner_at_the_wrong_version_fails_the_push():
    t, _, learner, _ = nccl_setup()
    learner.version = 5
    t0 = time.time()
    with pytest.raises(SyncError, match="asked to send policy version 1"):
        t.push(1)
    assert time.time() - t0 < 1.0  # the learner's failure surfaces without waiting for the engines
    assert t.broken  # the engines may still sit in the broadcast


def test_get_all_over_ray_refs_fails_fast_and_names_late_calls():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        nap = ray.remote(num_cpus=0)(lambda s: time.sleep(s) or s)
        boom = ray.remote(num_cpus=0)(lambda: 1 / 0)
        assert get_all([nap.remote(0), nap.remote(0.1)], 30, "naps") == [0, 0.1]
        with pytest.raises(SyncTimeoutError, match="slow one"):
            get_all([nap.remote(0), nap.remote(20)], 1.0, "naps", ["quick one", "slow one"])
        t0 = time.time()
        with pytest.raises(ray.exceptions.RayTaskError):
            get_all([nap.remote(20), boom.remote()], 30, "mixed")
        assert time.time() - t0 < 10
    finally:
        if started:
            ray.shutdown()


@pytest.mark.parametrize("level", [1, 2])
def test_ipc_skipped_step_brings_engines_back(level):
    log = []
    engine, learner = FakeEngine("engine0", log), FakeLearner(log)
    t = CudaIpcTransport(timeout_s=2, sleep_level=level)
    t.setup(Handle(learner), [Handle(engine)], ["engine0"])
    log.clear()
    t.sleep_engines()
    t.wake_engines()  # the learner skipped its step: version stays 0
    mine = [w for _, w in log if _ == "engine0"]
    if level == 1:  # old weights were kept on the CPU
        assert mine == [f"sleep:{level}", "wake:"]
    else:  # level 2 dropped them: the learner sends the current version again
        assert mine == [f"sleep:{level}", "wake:weights", "ipc", "wake:kv_cache"]
    assert t.version == 0 == engine.version
    assert ObjectStoreTransport(timeout_s=1).wake_engines() == []


# -- the resident IPC buffer ------------------------------------------------------------------------------------
@given(st.lists(st.integers(1, 700), min_size=1, max_size=30), st.integers(1, 2000))
def test_ipc_layout_places_every_tensor_once_aligned_and_apart(sizes, bound):
    names = [f"w{i}" for i in range(len(sizes))]
    layout = ipc_layout(names, [[s] for s in sizes], ["uint8"] * len(sizes), sizes, bound)
    assert [n for c in layout for n in c["names"]] == names
    assert buffer_bytes(layout) == max(c["nbytes"] for c in layout)
    i = 0
    for c in layout:
        ends = 0
        for off in c["offsets"]:
            assert off % ALIGN_BYTES == 0 and off >= ends  # aligned, and after the previous tensor's end
            ends = off + sizes[i]
            i += 1
        assert c["nbytes"] == ends
        assert c["nbytes"] <= bound or len(c["names"]) == 1  # only a tensor larger than the bound goes alone


def ipc_pair(bucket_bytes, engines=1, awake=True):
    log = []
    fakes = [FakeEngine(f"engine{i}", log) for i in range(engines)]
    learner = FakeLearner(log)
    t = CudaIpcTransport(timeout_s=2, awake=awake, bucket_bytes=bucket_bytes)
    t.setup(Handle(learner), [Handle(e) for e in fakes], [e.name for e in fakes])
    log.clear()
    return t, fakes, learner, log


def test_ipc_update_in_chunks_delivers_every_weight_and_reuses_one_buffer():
    t, engines, learner, log = ipc_pair(bucket_bytes=64)  # the largest tensor: one chunk each or so
    for version in (1, 2):
        with torch.no_grad():
            for p in learner.model.parameters():
                p.add_(1.0)
        learner.version = version
        res = t.push(version, in_flight=version == 2)
        [sent] = [r for r in res.results if r["actor"] == "learner0"]
        assert sent["chunks"] >= 3 and set(sent["parts"]) == {"start", "pack", "load"}
        want = {n: p.detach().to(torch.bfloat16) for n, p in learner.model.named_parameters()}
        for e in engines:
            assert set(e.received) == set(want) and all(torch.equal(e.received[n], want[n]) for n in want)
            assert e.version == version
    mine = [w for _, w in log]
    chunks = sent["chunks"]
    # not in flight: loads only; in flight: one pause before the first chunk, one resume after the last
    assert mine == ["ipc"] * chunks + ["pause:keep"] + ["ipc"] * chunks + ["resume"]
    assert len(engines[0].buffers) == 1  # the same buffer every chunk of every update


def test_ipc_update_refuses_weights_that_no_longer_match_the_layout():
    t, _, learner, log = ipc_pair(bucket_bytes=1 << 20)
    learner.version = 1
    t.push(1)
    learner.model.append(torch.nn.Linear(2, 2))  # a parameter the buffer's layout has no room for
    learner.version = 2
    log.clear()
    with pytest.raises(SyncError, match="parameters no longer match the IPC buffer's layout"):
        t.push(2)
    assert log == []  # refused before any engine loaded a chunk


def test_a_failed_in_flight_ipc_update_leaves_no_engine_paused():
    t, engines, learner, log = ipc_pair(bucket_bytes=1 << 20)
    engines[0].hang = True  # its worker raises while loading
    learner.version = 1
    with pytest.raises(RuntimeError, match="worker failed"):
        t.push(1, in_flight=True)
    assert log[0] == ("engine0", "pause:keep") and log[-1] == ("engine0", "resume")


def test_vllm_compiles_only_when_asked():
    from rlgen.config import EngineConfig
    from rlgen.engines.vllm.args import build_engine_args

    plain = build_engine_args("/m", EngineConfig(kind="vllm"))
    assert plain["compilation_config"] == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    assert "compilation_config" not in build_engine_args("/m", EngineConfig(kind="vllm", torch_compile=True))
    eager = build_engine_args("/m", EngineConfig(kind="vllm", enforce_eager=True))
    assert "compilation_config" not in eager and eager["enforce_eager"] is True
    given = build_engine_args("/m", EngineConfig(kind="vllm"), overrides={"compilation_config": {"mode": 3}})
    assert given["compilation_config"] == {"mode": 3}  # engine_args given by the caller win


# -- colocated learner groups: every rank sends to its own GPU's engines ------------------------------------------
def ranks_pair(tp: int, slow_rank: int | None = None):
    """Two learner ranks (GPUs gpu0 and gpu1) that meet at a shared barrier, and their engines: one per GPU at
    TP 1, one over both GPUs at TP 2. slow_rank packs each chunk late, as a rank still finishing its step would."""
    log = []
    barrier = threading.Barrier(2)
    ranks = [FakeLearner(log) for _ in range(2)]
    for r, learner in enumerate(ranks):
        learner.gpu, learner.name, learner.world_size = f"gpu{r}", f"learner{r}", 2
        learner._ranks_barrier = lambda: barrier.wait(timeout=5)
    if slow_rank is not None:
        slow, pack = ranks[slow_rank], ranks[slow_rank]._pack
        slow._pack = lambda weights, view: (time.sleep(0.05), pack(weights, view))[1]
    if tp == 1:
        engines, leads = [FakeEngine("engine0", log, gpus=["gpu0"]), FakeEngine("engine1", log, gpus=["gpu1"])], [0, 1]
    else:
        engines, leads = [FakeEngine("engine0", log, gpus=["gpu0", "gpu1"])], [0]
    t = CudaIpcTransport(timeout_s=5, awake=True, bucket_bytes=64, leads=leads, tp_sizes=[tp] * len(engines))
    handles = [Handle(lr) for lr in ranks]
    t.setup(handles[0], [Handle(e) for e in engines], [e.name for e in engines], ranks=handles)
    return t, ranks, engines


@pytest.mark.parametrize("tp", [1, 2])
def test_each_rank_of_a_colocated_group_sends_its_own_gpus_engines_their_weights(tp):
    t, ranks, engines = ranks_pair(tp, slow_rank=1)
    assert t.lockstep is (tp == 2)  # ranks meet at every chunk only where an engine reads several GPUs' buffers
    for version in (1, 2):
        for learner in ranks:  # a data-parallel step leaves every rank with the same weights
            with torch.no_grad():
                for p in learner.model.parameters():
                    p.add_(float(version))
            learner.version = version
        res = t.push(version, in_flight=version == 2)
        want = {n: p.detach().to(torch.bfloat16) for n, p in ranks[0].model.named_parameters()}
        for e in engines:  # every worker found the weights in its own GPU's buffer (FakeEngine checks them alike)
            assert e.version == version and set(e.received) == set(want)
            assert all(torch.equal(e.received[n], want[n]) for n in want)
        sent = {r["actor"]: r for r in res.results if r["actor"].startswith("learner")}
        assert set(sent) == {"learner0", "learner1"} and sent["learner0"]["chunks"] >= 3
        assert ("ranks" in sent["learner0"]["parts"]) is (tp == 2)
    assert all(len(e.buffers) == len(e.gpus) for e in engines)  # one buffer per GPU, reused every chunk


def test_an_engine_over_two_gpus_reads_a_rank_s_buffer_before_it_is_packed_without_the_meeting():
    t, _, _ = ranks_pair(2, slow_rank=1)
    t.tp_sizes = [1]  # as if no engine spanned GPUs: the ranks no longer meet at each chunk
    for learner in (t.ranks[0]._obj, t.ranks[1]._obj):
        with torch.no_grad():
            for p in learner.model.parameters():
                p.add_(1.0)
        learner.version = 1
    with pytest.raises(AssertionError):  # the engine's workers saw two different buffers
        t.push(1)


def test_lead_ranks_follow_each_engines_first_gpu():
    tp2 = plan_of("engine=vllm_tp2", "hardware=4xh100", "hardware.colocated=true")
    assert [e.gpus for e in tp2.engines] == [(0, 1), (2, 3)] and tp2.engine_leads == [0, 2]
    tp1 = plan_of("engine=vllm", "hardware=2xh100", "hardware.colocated=true", "model=qwen2_5_0_5b")
    assert tp1.engine_leads == [e.gpus[0] for e in tp1.engines] and {0, 1} <= set(tp1.engine_leads)
    transport = make_transport(tp2, tp2.config)
    assert isinstance(transport, CudaIpcTransport) and transport.leads == [0, 2]
