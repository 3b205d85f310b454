"""One source of truth: every plan the plan accepts, over every preset combination (engine x hardware x
colocated), is set up by the run's set-up as planned. A fake Ray cluster of two nodes with 8 fake GPUs each
stands in for the machines, and stand-in actors for vLLM and DeepSpeed; they receive the constructor
arguments the real classes would, and report where they landed. Plans the plan refuses are counted, so a
preset that stops planning shows up too."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray.cloudpickle
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.plan import PlanError, Transport, build_plan
from rlgen.runtime.cluster import actors as actor_classes
from rlgen.runtime.setup import set_up, tear_down

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stand-ins travel to the workers by value

ENGINES = ["hf", "vllm", "vllm_tp2", "vllm_tp4"]
HARDWARE = ["cpu", "2xcpu", "1xh100", "1xh200", "2xh200", "4xh200", "8xh100", "8xh200", "2x8xh100"]
COLOCATED = [False, True]
ACCEPTED_PLANS = 42  # of the 72 combinations today; a change in either direction must be deliberate
MEET_S = 120.0  # how long a stand-in engine that shares its GPU waits for the others to be created
MEETING = Path(tempfile.gettempdir()) / f"rlgen-plan-vs-setup-{os.getpid()}"  # the driver's, sent by value


def _where() -> dict:
    ctx = ray.get_runtime_context()
    return {"pid": os.getpid(), "node": ctx.get_node_id(), "gpus": list(ctx.get_accelerator_ids().get("GPU", [])),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


class StandInEngine:
    def __init__(self, model_path, engine, device="cpu", seed=0, name="engine0", version=0, **kwargs):
        self.name, self.device, self.kwargs, self.transfer = name, device, sorted(kwargs), None
        self.received: list[int] = []  # versions that came over the weight transport
        self.share, self.handles, self.met = engine.gpu_memory_utilization, None, None

    def health(self) -> dict:
        return {"ok": True, "name": self.name, "device": self.device, "kwargs": self.kwargs,
                "transfer": self.transfer, "received": self.received, "share": self.share, "met": self.met,
                "handles": self.handles, **_where()}

    def init_weight_transfer(self, init_info: dict, timeout_s: float = 0.0) -> dict:
        self.transfer = dict(init_info)
        return {"ok": True}

    def receive_weights(self, update_info: dict, version: int, timeout_s: float = 0.0, *, pause: bool = False) -> dict:  # NCCL
        self.received.append(version)
        return {"actor": self.name, "version": version, "spans": []}

    def receive_ipc(self, handle: dict, chunk: dict, version: int, **kwargs) -> dict:  # one chunk of an IPC update
        self.handles = sorted(p["gpu"] for p in handle["parts"])  # every learner rank's buffer, by its GPU
        self.received.append(version)
        return {"actor": self.name, "version": version, "spans": []}


class MeetingEngine(StandInEngine):
    """A stand-in whose start ends only once every engine sharing its GPU has been created: engines started one
    after the other would never meet, and the first would report met=False after MEET_S."""

    def __init__(self, model_path, engine, *args, **kwargs):
        super().__init__(model_path, engine, *args, **kwargs)
        MEETING.mkdir(parents=True, exist_ok=True)
        (MEETING / self.name).touch()
        deadline = time.time() + MEET_S
        while len(list(MEETING.iterdir())) < engine.engines_per_gpu and time.time() < deadline:
            time.sleep(0.05)
        self.met = len(list(MEETING.iterdir())) >= engine.engines_per_gpu


class StandInLearner:
    def __init__(self, model_path, algo, monitor, seed=0, device="cpu", rank=0, name="learner0", **kwargs):
        self.name, self.rank, self.kwargs, self.world = name, rank, kwargs, None

    def health(self) -> dict:
        return {"ok": True, "name": self.name, "rank": self.rank, "world_size": self.kwargs.get("world_size", 1),
                "master_port": self.kwargs.get("master_port"), "nccl_world": self.world, **_where()}

    def weight_meta(self, dtype: str) -> dict:
        return {"names": ["w"], "dtype_names": [dtype], "shapes": [[2]], "max_tensor_bytes": 4, "total_bytes": 4}

    def sync_endpoint(self) -> tuple[str, int]:
        return "127.0.0.1", 29500

    def init_nccl_sender(self, addr: str, port: int, world: int, timeout_s: float) -> dict:
        self.world = world
        return {"ok": True}

    def send_weights_nccl(self, version: int, dtype: str, bucket_bytes: int, timeout_s: float) -> dict:
        return {"actor": self.name, "version": version, "spans": []}

    def ipc_handle(self, dtype: str, bucket_bytes: int) -> dict:
        return {"gpu": _where()["gpus"][0]}

    def send_weights_ipc(self, engines: list, version: int, dtype: str, bucket_bytes: int, timeout_s: float,
                         pause: bool = False, handle: dict | None = None, lockstep: bool = False) -> dict:
        done = ray.get([e.receive_ipc.remote(handle, {"names": ["w"]}, version, pause=pause) for e in engines],
                       timeout=60)
        return {"actor": self.name, "version": version, "engines": done, "spans": []}


def _stand_in(real, cls):
    """The real class chooser's constructor arguments, with a stand-in class."""
    return lambda *args: (cls, real(*args)[1])


def _plans() -> tuple[list, list]:
    accepted, refused = [], []
    for engine, hardware, colocated in itertools.product(ENGINES, HARDWARE, COLOCATED):
        overrides = [f"engine={engine}", f"hardware={hardware}", f"hardware.colocated={str(colocated).lower()}",
                     "progress=false", "eval.every=0"]
        try:
            accepted.append((overrides, build_plan(compose_run_config(overrides))))
        except PlanError:
            refused.append(overrides)
    return accepted, refused


@pytest.fixture(scope="module")
def fake_cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        "_system_config": {"enable_worker_prestart": False, "prestart_worker_first_driver": False}})
    for _ in range(2):
        c.add_node(num_cpus=32, num_gpus=8)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def _stand_ins(monkeypatch) -> None:
    from rlgen.models import prepare_model

    tiny = prepare_model(compose_run_config([]))  # what every stand-in is handed; no preset is built
    monkeypatch.setattr("rlgen.runtime.start.loaders.prepare_model", lambda cfg, device="cpu": tiny)
    monkeypatch.setattr("rlgen.runtime.setup.engine_class",
                        _stand_in(actor_classes.engine_class, StandInEngine))
    monkeypatch.setattr("rlgen.runtime.setup.learner_class",
                        _stand_in(actor_classes.learner_class, StandInLearner))


def _placement(plan) -> tuple:
    """What set-up makes of a plan that the checks below read: its device, layout and transport, and where each
    engine and learner rank goes. Plans alike in these (a preset's H100 and H200 variants, say) set up alike."""
    engines = tuple((s.index, s.node, s.gpus, s.tensor_parallel_size, s.per_gpu) for s in plan.engines)
    return plan.device, plan.colocated, plan.transport, engines, tuple(plan.learners)


# make test's share: every transport, split and hybrid, TP 1, 2 and 4, one and several engines a GPU, NCCL to
# several engines and to TP workers; the rest (make test-all) repeats these layouts on more GPUs
SMALL_HOSTS = {"cpu", "2xcpu", "1xh100", "1xh200", "2xh200"}
ON_FOUR_GPUS = {"engine=vllm", "engine=vllm_tp2", "engine=vllm_tp4"}  # of 4xh200, all but hybrids of over 2 engines


def _small(overrides: list[str], plan) -> bool:
    host = overrides[1].removeprefix("hardware=")
    if host in SMALL_HOSTS:
        return True
    return host == "4xh200" and overrides[0] in ON_FOUR_GPUS and not (plan.colocated and len(plan.engines) > 2)


@pytest.mark.parametrize("hosts", [
    "small",
    pytest.param("large", marks=pytest.mark.long),
])
def test_every_accepted_plan_is_set_up_as_planned(fake_cluster, monkeypatch, tmp_path, hosts):
    _stand_ins(monkeypatch)
    accepted, refused = _plans()
    assert len(accepted) == ACCEPTED_PLANS, [o[:3] for o, _ in accepted]
    mine = [(o, plan) for o, plan in accepted if _small(o, plan) == (hosts == "small")]
    done: set[tuple] = set()
    for n, (overrides, plan) in enumerate(mine):
        if _placement(plan) in done:  # set up already, as another preset's plan
            continue
        done.add(_placement(plan))
        what = " ".join(overrides[:3])
        node_ids, engines, learners = _set_up(compose_run_config(overrides), plan, tmp_path / str(n))
        _check(plan, node_ids, engines, learners, what)
    assert len(done) >= len(mine) * 2 // 3, len(done)  # the presets place their actors in many ways


def _set_up(cfg, plan, out) -> tuple[list[str], list[dict], list[dict]]:
    """Set the plan up with the stand-ins; (Ray node ids, engines' and learners' health reports)."""
    run = set_up(plan, out, console=Console(quiet=True))
    try:
        run.learners_ready()  # as the loop does before the first training step
        if plan.transport is Transport.cuda_ipc:  # one IPC update of the starting weights, through every rank
            run.built.transport.start()
        engines = ray.get([a.health.remote() for a in run.built.engines], timeout=120)
        learners = ray.get([a.health.remote() for a in run.built.learners], timeout=120)
    finally:
        tear_down(run)
    return run.built.node_ids, engines, learners


def _check(plan, node_ids: list[str], engines: list[dict], learners: list[dict], what: str) -> None:
    assert [e["name"] for e in engines] == [f"engine{s.index}" for s in plan.engines], what
    assert [lr["rank"] for lr in learners] == [s.rank for s in plan.learners], what
    plan_nodes = sorted({s.node for s in plan.engines} | {s.node for s in plan.learners})
    ray_node = dict(zip(plan_nodes, node_ids))
    learner_gpu = {(slot.node, slot.gpu): lr["gpus"][0] for slot, lr in zip(plan.learners, learners) if lr["gpus"]}
    for slot, e in zip(plan.engines, engines):  # on its plan node, holding its TP group's GPUs
        assert e["node"] == ray_node[slot.node], what
        if plan.colocated and slot.tensor_parallel_size > 1:  # it asks for none, and sees its slot's learners' GPUs
            assert e["gpus"] == [] and e["visible"] == ",".join(learner_gpu[(slot.node, g)] for g in slot.gpus), what
            continue
        assert len(e["gpus"]) == (0 if plan.device == "cpu" else 1 if plan.colocated else slot.tensor_parallel_size), what
        if plan.colocated:  # beside the learner rank on its GPU
            assert e["gpus"] == [learner_gpu[(slot.node, slot.gpus[0])]], what
    for slot, lr in zip(plan.learners, learners):
        assert lr["node"] == ray_node[slot.node], what
        assert len(lr["gpus"]) == (0 if plan.device == "cpu" else 1), what
        assert lr["world_size"] == len(plan.learners), what
    for node in set(ray_node.values()):  # no GPU is given twice, except an engine beside its colocated learner
        learner_gpus = [g for lr in learners if lr["node"] == node for g in lr["gpus"]]
        engine_gpus = [g for e in engines if e["node"] == node for g in e["gpus"]]
        assert len(set(learner_gpus)) == len(learner_gpus), what
        if plan.colocated:
            assert set(engine_gpus) <= set(learner_gpus), what
        else:
            assert len(set(engine_gpus)) == len(engine_gpus) and not set(engine_gpus) & set(learner_gpus), what
    if plan.transport is Transport.nccl:  # one group: learner rank 0, then every engine's TP workers
        world = 1 + sum(s.tensor_parallel_size for s in plan.engines)
        assert learners[0]["nccl_world"] == world, what
        offsets = [1 + sum(s.tensor_parallel_size for s in plan.engines[:i]) for i in range(len(plan.engines))]
        assert [e["transfer"]["rank_offset"] for e in engines] == offsets, what
        assert all(e["kwargs"] == ["engine_args", "env"] for e in engines), what
    elif plan.transport is Transport.cuda_ipc:
        assert all(e["transfer"] == {} for e in engines), what
        # the first update hands every engine the buffers of every learner rank, one per GPU
        assert all(e["handles"] == sorted(learner_gpu.values()) for e in engines), what
    else:
        assert all(e["transfer"] is None for e in engines), what
    # NCCL sends the starting weights once before step 0 (its warm-up), IPC here by _set_up; the object store sends
    # none, since fresh engines hold them already (the first batch goes while the learners start)
    warmed = plan.transport in (Transport.nccl, Transport.cuda_ipc)
    assert all(e["received"] == ([0] if warmed else []) for e in engines), what


def test_engines_sharing_a_gpu_start_together_beside_the_learner_and_split_its_share(fake_cluster, monkeypatch,
                                                                                      tmp_path):
    _stand_ins(monkeypatch)
    monkeypatch.setattr("rlgen.runtime.setup.engine_class", _stand_in(actor_classes.engine_class, MeetingEngine))
    overrides = ["engine=vllm", "hardware=1xh200", "engine.engines_per_gpu=2", "progress=false", "eval.every=0"]
    cfg = compose_run_config(overrides)
    plan = build_plan(cfg)
    try:
        node_ids, engines, learners = _set_up(cfg, plan, tmp_path)
    finally:
        shutil.rmtree(MEETING, ignore_errors=True)
    _check(plan, node_ids, engines, learners, "two engines per GPU")
    assert [e["gpus"] for e in engines] == [learners[0]["gpus"]] * 2  # both on the learner's one GPU
    share = plan.config.engine.gpu_memory_utilization
    assert [e["share"] for e in engines] == [round(share / 2, 4)] * 2
    # both are created at once (a vLLM engine takes turns only to measure its KV cache, inside the engine)
    assert [e["met"] for e in engines] == [True, True]
