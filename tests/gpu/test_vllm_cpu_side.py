"""The parts of the vllm engine and the bench that run without a GPU (these run in CI too)."""

from __future__ import annotations

import sys

import pytest

from rlgen.config import BenchConfig, EngineConfig


def test_importing_the_engine_and_bench_pulls_no_vllm_or_ray():
    import subprocess

    code = "import sys, rlgen.engines.vllm.engine, rlgen.bench; print(sorted({'vllm', 'ray'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("path", ["rlgen.engines.vllm.engine:VLLMEngine", "rlgen.engines.remote.engine:RemoteEngine"])
def test_threaded_engine_actors_have_no_coroutine_methods(path):
    """Ray turns a class with any ``async def`` method (private ones too) into an asyncio actor, whose plain
    methods run one at a time on its event loop: pause() and weight updates would wait for generate()."""
    import importlib
    import inspect

    module, name = path.split(":")
    cls = getattr(importlib.import_module(module), name)
    coroutines = [n for n, f in inspect.getmembers(cls, inspect.isfunction)
                  if inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)]
    assert coroutines == []


def test_a_threaded_actor_answers_while_a_call_blocks():
    """What the engine actors rely on, through Ray itself: with max_concurrency > 1 and no coroutine methods,
    a second call runs while the first one blocks (an asyncio actor would make it wait)."""
    import threading

    ray = pytest.importorskip("ray")

    class Blocking:
        def __init__(self):
            self.gate = threading.Event()

        def wait(self):
            return self.gate.wait(30)

        def release(self):
            self.gate.set()
            return True

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(Blocking).options(max_concurrency=4, num_cpus=0).remote()
        blocked = actor.wait.remote()
        assert ray.get(actor.release.remote(), timeout=20) is True  # answered while wait() still blocks
        assert ray.get(blocked, timeout=20) is True
    finally:
        if started:
            ray.shutdown()


def test_engine_without_cuda_says_so(monkeypatch):
    import torch

    from rlgen.engines.vllm.engine import EngineError, VLLMEngine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EngineError, match="CUDA GPU"):
        VLLMEngine("/nonexistent", EngineConfig(kind="vllm"), device="cuda")
    with pytest.raises(EngineError, match="engine=hf"):
        VLLMEngine("/nonexistent", EngineConfig(kind="vllm"), device="cpu")


def test_engine_args_follow_the_config():
    from rlgen.engines.vllm.engine import TUNED_DEFAULTS, build_engine_args

    e = EngineConfig(
        kind="vllm",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.8,
        enable_prefix_caching=False,
        max_model_len=3000,
        max_num_seqs=77,
        enforce_eager=True,
        dtype="float16",
        enable_sleep_mode=True,
    )
    args = build_engine_args("/m", e, seed=5)
    assert args["model"] == "/m" and args["skip_tokenizer_init"] is True and args["seed"] == 5
    assert (args["tensor_parallel_size"], args["gpu_memory_utilization"], args["enable_prefix_caching"]) == (
        2,
        0.8,
        False,
    )
    assert (args["max_model_len"], args["max_num_seqs"], args["enforce_eager"], args["dtype"]) == (
        3000,
        77,
        True,
        "float16",
    )
    assert args["enable_sleep_mode"] is True
    for k, v in TUNED_DEFAULTS.items():
        assert args[k] == v
    assert (
        build_engine_args("/m", e, overrides={"max_num_seqs": 9, "stream_interval": 4})["max_num_seqs"] == 9
    )
    # TP > 1: vLLM's own worker processes on the actor's GPUs, never its Ray executor inside our actor
    assert args["distributed_executor_backend"] == "mp"
    one = build_engine_args("/m", EngineConfig(kind="vllm", tensor_parallel_size=1))
    assert "distributed_executor_backend" not in one


def test_engine_context_is_capped_by_the_model(tmp_path):
    """vLLM refuses a max_model_len beyond the model's positions; the tiny preset has 128."""
    import json

    from rlgen.engines.vllm.engine import build_engine_args

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    e = EngineConfig(kind="vllm", max_model_len=4096)
    assert build_engine_args(str(tmp_path), e)["max_model_len"] == 128
    assert build_engine_args(str(tmp_path), EngineConfig(kind="vllm", max_model_len=64))["max_model_len"] == 64
    assert build_engine_args("/no/such/model", e)["max_model_len"] == 4096


def test_seed_mixing_separates_prompts():
    from rlgen.engines.vllm.engine import mix_seed

    assert mix_seed(None, 3) is None
    assert mix_seed(7, 0) != mix_seed(7, 1)
    assert mix_seed(7, 1) == mix_seed(7, 1)
    assert 0 <= mix_seed(2**40, 10**9) < 2**31


def test_weight_chunks_keep_order_and_size():
    import torch

    from rlgen.sync.receiver import chunk_weights

    items = [(f"w{i}", torch.zeros(256, dtype=torch.float32)) for i in range(10)]  # 1 KiB each
    chunks = list(chunk_weights(items, chunk_bytes=3 * 1024))
    assert [len(c) for c in chunks] == [3, 3, 3, 1]
    assert [n for c in chunks for n, _ in c] == [n for n, _ in items]
    big = [("big", torch.zeros(4096)), ("small", torch.zeros(1))]
    assert [len(c) for c in chunk_weights(big, chunk_bytes=1024)] == [1, 1]


def test_workload_is_seeded_and_shaped():
    from rlgen.bench import make_workload, workload_summary

    b = BenchConfig(
        num_prompts=64,
        samples_per_prompt=4,
        prompt_len=16,
        response_len_median=100,
        response_len_sigma=1.0,
        response_len_min=10,
        response_len_max=400,
        seed=3,
    )
    a, again = make_workload(b, 1000), make_workload(b, 1000)
    assert a == again
    assert len(a) == 64 and all(len(r.prompt_ids) == 16 and r.sampling.n == 4 for r in a)
    assert all(3 <= t < 1000 for r in a for t in r.prompt_ids)
    lens = [r.sampling.max_new_tokens for r in a]
    assert min(lens) >= 10 and max(lens) <= 400 and len(set(lens)) > 20
    assert all(r.sampling.ignore_eos for r in a)
    s = workload_summary(a)
    assert s["sequences"] == 256 and s["response_tokens"] == 4 * sum(lens)
    other = make_workload(BenchConfig(**{**b.__dict__, "seed": 4}), 1000)
    assert [r.sampling.max_new_tokens for r in other] != lens


def test_hf_batches_fit_memory_and_keep_order():
    from rlgen.bench import HF_LOGIT_BYTES, HF_MEMORY_FRACTION, hf_chunks, make_workload

    b = BenchConfig(num_prompts=40, samples_per_prompt=8, response_len_max=2048, seed=0)
    reqs = make_workload(b, 151936)
    gpu = 80 * 2**30
    chunks = hf_chunks(reqs, max_rows=64, vocab=151936, gpu_bytes=gpu)
    assert [r for c in chunks for r in c] == reqs
    for c in chunks:
        rows = sum(r.sampling.n for r in c)
        longest = max(r.sampling.max_new_tokens for r in c)
        assert rows <= 64
        assert len(c) == 1 or HF_LOGIT_BYTES * rows * longest * 151936 <= HF_MEMORY_FRACTION * gpu


def test_check_completions_flags_wrong_lengths():
    from rlgen.bench import check_completions, make_workload
    from rlgen.types import Completion

    reqs = make_workload(
        BenchConfig(
            num_prompts=2, samples_per_prompt=2, prompt_len=4, response_len_min=3, response_len_max=5
        ),
        50,
    )
    good = [
        Completion(
            r.group_id,
            list(r.prompt_ids),
            [5] * r.sampling.max_new_tokens,
            [-1.0] * r.sampling.max_new_tokens,
            "length",
            0,
        )
        for r in reqs
        for _ in range(2)
    ]
    assert check_completions(reqs, good) == {
        "tokens": sum(len(c.token_ids) for c in good),
        "completions": 4,
        "n_ok": True,
        "lengths_ok": True,
        "logprobs_ok": True,
    }
    bad = good[:-1] + [Completion(0, [], [5], [0.5], "length", 0)]
    chk = check_completions(reqs, bad)
    assert not chk["lengths_ok"] and not chk["logprobs_ok"]


def test_version_changes_keep_those_inside_the_completion_that_change_it():
    from rlgen.engines.vllm.loop import version_changes

    assert version_changes([], 3, 10) == []
    assert version_changes([(4, 4)], 3, 10) == [(4, 4)]
    assert version_changes([(4, 4), (4, 5), (8, 6)], 3, 10) == [(4, 5), (8, 6)]  # same position: the later
    assert version_changes([(12, 4)], 3, 10) == []  # the completion had ended: all its tokens came from 3
    assert version_changes([(0, 4)], 3, 5) == [(0, 4)]  # not started when the update came


def test_live_token_counts_read_the_engines_running_requests():
    import asyncio
    from types import SimpleNamespace

    from rlgen.engines.vllm.loop import live_token_counts

    def state(rid, index, n):
        return SimpleNamespace(external_req_id=rid, request_index=index,
                               detokenizer=SimpleNamespace(num_output_tokens=lambda: n))

    states = {"a": state("engine0-3-0", 0, 17), "b": state("engine0-3-0", 1, 9), "c": state("engine1-3-0", 0, 4),
              "d": SimpleNamespace(external_req_id="engine0-4-1", request_index=None, detokenizer=None)}
    llm = SimpleNamespace(output_processor=SimpleNamespace(request_states=states))
    counts = asyncio.run(live_token_counts(llm, "engine0-"))
    assert counts == {("engine0-3-0", 0): 17, ("engine0-3-0", 1): 9}
    assert asyncio.run(live_token_counts(SimpleNamespace(), "engine0-")) == {}  # internals missing: nothing known


def test_the_engine_loop_cancels_a_call_its_caller_cancelled():
    """LoopThread.run, which every vllm engine call waits in: a call cancelled through rlgen.engines.cancel
    cancels its coroutine (where vLLM would abort its requests) within a poll, and raises CallCancelled."""
    import asyncio
    import threading
    import time

    from rlgen.engines.cancel import CallCancelled, run
    from rlgen.engines.vllm.loop import DEAD_POLL_S, LoopThread

    loop, seen = LoopThread("test"), {}

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise

    event = threading.Event()
    threading.Timer(0.2, event.set).start()
    t0 = time.time()
    try:
        with pytest.raises(CallCancelled, match="cancelled by its caller"):
            run(event, loop.run, forever(), 60.0, "a call")
        assert time.time() - t0 < 0.2 + 2 * DEAD_POLL_S
        deadline = time.time() + 5
        while "cancelled" not in seen and time.time() < deadline:
            time.sleep(0.01)
        assert seen.get("cancelled")
        assert loop.run(asyncio.sleep(0, result=7), 5.0, "the next call") == 7  # the loop serves on
    finally:
        loop.close()


def test_a_failed_nccl_join_says_where_and_the_usual_cause(monkeypatch):
    """The engine's NCCL join for a trainer's weight transfer (TRL's path): a failure in vLLM's join comes back as
    one EngineError that names the group's address, NCCL's own words and the NCCL_CUMEM_ENABLE the engine runs with
    (a trainer that differs in it fails this way)."""
    import types

    from rlgen.engines.base import EngineDead
    from rlgen.engines.vllm.engine import EngineError, VLLMEngine
    from rlgen.engines.vllm.loop import LoopThread

    fake = types.ModuleType("vllm.distributed.weight_transfer.base")
    fake.WeightTransferInitRequest = lambda init_info: init_info
    for name in ("vllm", "vllm.distributed", "vllm.distributed.weight_transfer"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "0")

    class Llm:
        async def init_weight_transfer_engine(self, request):
            raise RuntimeError("Invocation failed\nRuntimeError: NCCL error: unhandled cuda error")

    engine = VLLMEngine.__new__(VLLMEngine)
    engine.name, engine.llm, engine._loop = "engine0", Llm(), LoopThread("test")
    try:
        info = {"master_address": "10.0.0.5", "master_port": 51216, "rank_offset": 1, "world_size": 2}
        with pytest.raises(EngineError) as caught:
            engine.init_weight_transfer(info, timeout_s=10.0)
        text = str(caught.value)
        assert "engine0 could not join the trainer's NCCL group at 10.0.0.5:51216" in text
        assert "(RuntimeError: NCCL error: unhandled cuda error)" in text
        assert "NCCL_CUMEM_ENABLE=0" in text and "start the trainer with the same value" in text

        class DeadCore:  # the loop's own sentence (a dead core, which the run's fault handling acts on) stays
            async def init_weight_transfer_engine(self, request):
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

        engine.llm = DeadCore()
        with pytest.raises(EngineDead, match="the vLLM engine core died") as dead:
            engine.init_weight_transfer(info, timeout_s=10.0)
        assert not isinstance(dead.value, EngineError)
    finally:
        engine._loop.close()


def _engine_for_updates(llm):
    """A VLLMEngine around a stand-in AsyncLLM, with only what its weight-update calls read."""
    import threading

    from rlgen.engines.vllm.engine import VLLMEngine
    from rlgen.engines.vllm.loop import LoopThread

    engine = VLLMEngine.__new__(VLLMEngine)
    engine.name, engine.llm, engine._loop = "engine0", llm, LoopThread("test")
    engine.version, engine.paused, engine.weights_on_gpu = 1, False, True
    engine._lock, engine._version_changes = threading.Lock(), {}
    return engine


class _Llm:
    """Records the calls an update makes on vLLM's AsyncLLM; collective_rpc fails or hangs where asked to."""

    def __init__(self, fail: BaseException | None = None, hang_s: float = 0.0):
        self.calls, self.fail, self.hang_s = [], fail, hang_s

    async def pause_generation(self, mode, clear_cache):
        self.calls.append(f"pause:{mode}")

    async def resume_generation(self):
        self.calls.append("resume")

    async def reset_prefix_cache(self):
        self.calls.append("reset")
        return True

    async def collective_rpc(self, method, timeout=None, args=()):
        import asyncio

        self.calls.append(f"rpc:{method.__name__}")
        if self.hang_s:
            await asyncio.sleep(self.hang_s)
        if self.fail is not None:
            raise self.fail
        return [len(args[0]["names"])]


def test_an_nccl_update_in_flight_pauses_the_engine_only_around_its_own_receive():
    """pause=True: the engine freezes its requests right before the receive and lets them go right after, inside
    the one call; its span and parts say how long it did not generate and where that went."""
    import time

    llm = _Llm()
    engine = _engine_for_updates(llm)
    try:
        t0 = time.time()
        out = engine.receive_weights({"names": ["w"]}, 2, timeout_s=5.0, pause=True)
        assert llm.calls == ["pause:keep", "rpc:receive_nccl_on_worker", "reset", "resume"]
        assert out["version"] == 2 == engine.version and not engine.paused
        [(phase, a, b)] = out["spans"]
        assert phase == "sync" and t0 <= a <= b <= time.time()
        assert set(out["parts"]) == {"pausing", "receive", "version", "resuming"}
        assert abs(sum(out["parts"].values()) - (b - a)) < 1e-3

        llm.calls.clear()  # no generation running: nothing is paused
        out = engine.receive_weights({"names": ["w"]}, 3, timeout_s=5.0)
        assert llm.calls == ["rpc:receive_nccl_on_worker", "reset"] and set(out["parts"]) == {"receive", "version"}
    finally:
        engine._loop.close()


def test_a_failed_nccl_update_in_flight_resumes_unless_the_workers_may_still_be_receiving():
    """A receive that failed lets the frozen requests go on; one that timed out leaves them paused, since its
    workers may still sit in the broadcast and the engine is restarted."""
    llm = _Llm(fail=RuntimeError("a shape did not match"))
    engine = _engine_for_updates(llm)
    try:
        with pytest.raises(RuntimeError, match="shape"):
            engine.receive_weights({"names": ["w"]}, 2, timeout_s=5.0, pause=True)
        assert llm.calls == ["pause:keep", "rpc:receive_nccl_on_worker", "resume"]
        assert not engine.paused and engine.version == 1

        engine.llm = slow = _Llm(hang_s=3.0)
        with pytest.raises(TimeoutError, match="receiving 1 tensors over NCCL"):
            engine.receive_weights({"names": ["w"]}, 2, timeout_s=0.5, pause=True)
        assert slow.calls == ["pause:keep", "rpc:receive_nccl_on_worker"] and engine.paused
    finally:
        engine._loop.close()
