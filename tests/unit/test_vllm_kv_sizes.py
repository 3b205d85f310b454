"""rlgen.engines.vllm.kvcache: the KV-cache size a vLLM engine measured, stored for its next start under a key
that changes with anything the size depends on, and the per-GPU lock that lets engines with a stored size start
side by side while one that measures starts alone. No GPU: NVML is absent here, so the key has no GPU part."""

from __future__ import annotations

import json
import multiprocessing as mp
import time

import pytest

from rlgen.engines.vllm.common import EngineError
from rlgen.engines.vllm.kvcache import GIB, KVSizes, MeasuredWatch, token_bytes

QWEN_0_5B = {"num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "hidden_size": 896,
             "use_sliding_window": False, "sliding_window": 32768}
VERSIONS = {"vllm": "0.26.0", "torch": "2.11.0"}
H100 = ["NVIDIA H100 80GB HBM3/85520809984"]


@pytest.fixture()
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("RLGEN_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN_0_5B))
    return folder


def args_of(model, **over):
    return {"model": str(model), "seed": 0, "dtype": "bfloat16", "gpu_memory_utilization": 0.45,
            "max_num_seqs": 2048, "tensor_parallel_size": 1, **over}


def test_token_bytes_match_the_planners_and_split_over_tensor_parallel_ranks():
    assert token_bytes(QWEN_0_5B, "bfloat16", 1) == 12288  # rlgen plan: "12288 KV bytes a token" at 0.5B
    assert token_bytes(QWEN_0_5B, "bfloat16", 2) == 6144
    assert token_bytes({"num_hidden_layers": 2}, "bfloat16", 1) is None  # no attention shape: not stored
    assert token_bytes({**QWEN_0_5B, "use_sliding_window": True}, "bfloat16", 1) is None


def test_a_measured_size_is_stored_and_found_again_by_the_same_setup_only(model):
    first = KVSizes(args_of(model), VERSIONS, devices="0", gpus=H100)
    assert first.stored() is None
    # vLLM's block count at this setup; the stored bytes give vLLM back exactly that many blocks
    assert first.record(num_blocks=181_765, block_size=16) == 181_765 * 16 * 12288
    again = KVSizes(args_of(model, seed=7), VERSIONS, devices="0", gpus=H100)  # the seed does not change the size
    assert again.stored() == 181_765 * 16 * 12288
    for other in (KVSizes(args_of(model, gpu_memory_utilization=0.225), VERSIONS, devices="0", gpus=H100),
                  KVSizes(args_of(model, max_num_seqs=256), VERSIONS, devices="0", gpus=H100),
                  KVSizes(args_of(model), {**VERSIONS, "vllm": "0.27.0"}, devices="0", gpus=H100),
                  KVSizes(args_of(model), VERSIONS, devices="0", gpus=["NVIDIA H200/150754820096"])):
        assert other.stored() is None, other.key
    (model / "config.json").write_text(json.dumps({**QWEN_0_5B, "num_hidden_layers": 12}))
    assert KVSizes(args_of(model), VERSIONS, devices="0", gpus=H100).stored() is None  # another model shape
    again.forget()
    assert KVSizes(args_of(model, seed=7), VERSIONS, devices="0", gpus=H100).stored() is None


def test_nothing_is_stored_or_taken_where_nvml_cannot_name_the_gpu(model, monkeypatch):
    from rlgen.engines.vllm import kvcache

    KVSizes(args_of(model), VERSIONS, devices="0", gpus=H100).record(num_blocks=100, block_size=16)
    monkeypatch.setattr(kvcache, "gpu_identity", lambda devices: None)  # NVML missing or failing
    blind = KVSizes(args_of(model), VERSIONS, devices="0")
    assert not blind.enabled and blind.stored() is None
    assert blind.record(num_blocks=100, block_size=16) is None


def test_a_kv_cache_of_another_dtype_is_not_stored(model):
    sizes = KVSizes(args_of(model, kv_cache_dtype="fp8"), VERSIONS, devices="0", gpus=H100)
    assert sizes.record(num_blocks=100, block_size=16) is None and sizes.stored() is None


def _hold(model_dir: str, cache: str, record: bool, hold_s: float, q) -> None:
    import os

    os.environ["RLGEN_CACHE_DIR"] = cache
    sizes = KVSizes(args_of(model_dir), VERSIONS, devices="9", gpus=H100)
    with sizes.start_slot("engine", timeout_s=30) as stored:
        q.put(("in", stored, time.time()))
        time.sleep(hold_s)
        if record:
            sizes.record(num_blocks=10, block_size=16)
        q.put(("out", stored, time.time()))


def _two_starts(ctx, model, cache: str, record: bool):
    """Two engine starts at once in their own processes, each holding the lock 1 s; (sorted entry times, sorted
    exit times, the stored size each saw)."""
    q = ctx.Queue()
    procs = [ctx.Process(target=_hold, args=(str(model), cache, record, 1.0, q)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [q.get(timeout=30) for _ in range(4)]
    for p in procs:
        p.join(30)
    ins = sorted(t for kind, _, t in got if kind == "in")
    outs = sorted(t for kind, _, t in got if kind == "out")
    return ins, outs, [s for kind, s, _ in got if kind == "in"]


def test_engines_that_measure_start_one_at_a_time_and_those_with_a_stored_size_together(model, tmp_path):
    ctx = mp.get_context("spawn")
    cache = str(tmp_path / "cache")
    # nothing stored: two engines measure, one after the other (the second then finds the first's size)
    ins, outs, _ = _two_starts(ctx, model, cache, record=True)
    assert ins[1] >= outs[0] - 0.05, (ins, outs)  # the second began after the first ended
    # a size is stored now: both start side by side
    ins, outs, stored = _two_starts(ctx, model, cache, record=False)
    assert ins[1] < outs[0], (ins, outs)  # their starts overlap
    assert stored == [10 * 16 * 12288] * 2


def test_waiting_for_the_lock_has_a_timeout_with_a_sentence(model, tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    holder = ctx.Process(target=_hold, args=(str(model), str(tmp_path / "cache"), False, 3.0, q))
    holder.start()
    assert q.get(timeout=30)[0] == "in"
    sizes = KVSizes(args_of(model), VERSIONS, devices="9", gpus=H100)
    with pytest.raises(EngineError, match="waited 1 s for another engine on GPU"):
        with sizes.start_slot("engine1", timeout_s=1.0):
            pass
    holder.join(30)


def test_an_unwritable_cache_costs_only_the_stored_size(model, tmp_path, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("RLGEN_CACHE_DIR", str(blocked))
    sizes = KVSizes(args_of(model), VERSIONS, devices="0", gpus=H100)
    assert sizes.record(num_blocks=100, block_size=16) is None and sizes.stored() is None


def _measure_and_log(model_dir: str, cache: str, log: str, q) -> None:
    """A measuring start: holds the lock alone, "logs" vLLM's size line after 0.5 s, ends 2.5 s later."""
    import os
    from pathlib import Path

    os.environ["RLGEN_CACHE_DIR"] = cache
    sizes = KVSizes(args_of(model_dir), VERSIONS, devices="9", gpus=H100)
    with sizes.start_slot("engine0", timeout_s=30) as stored:
        q.put(("in0", stored, time.time()))
        with MeasuredWatch(sizes, lambda: Path(log).read_text(), poll_s=0.05):
            time.sleep(0.5)
            with open(log, "a") as f:
                f.write("INFO gpu_worker.py:561] Available KV cache memory: 14.04 GiB\n")
            time.sleep(2.5)
        sizes.record(num_blocks=10, block_size=16)
        q.put(("out0", stored, time.time()))


def _second(model_dir: str, cache: str, q) -> None:
    import os

    os.environ["RLGEN_CACHE_DIR"] = cache
    time.sleep(0.2)  # after the measuring start took the lock
    sizes = KVSizes(args_of(model_dir), VERSIONS, devices="9", gpus=H100)
    with sizes.start_slot("engine1", timeout_s=30) as stored:
        q.put(("in1", stored, time.time()))


def test_a_measuring_engine_lets_the_next_start_in_once_vllm_logged_its_size(model, tmp_path):
    ctx = mp.get_context("spawn")
    q, log, cache = ctx.Queue(), tmp_path / "worker.out", str(tmp_path / "cache")
    log.write_text("an earlier start in this process: Available KV cache memory: 3.00 GiB\n")  # not counted
    procs = [ctx.Process(target=_measure_and_log, args=(str(model), cache, str(log), q)),
             ctx.Process(target=_second, args=(str(model), cache, q))]
    for p in procs:
        p.start()
    got = {kind: (stored, t) for kind, stored, t in (q.get(timeout=30) for _ in range(3))}
    for p in procs:
        p.join(30)
    assert got["in0"][0] is None  # nothing was stored: engine0 measured
    handed = got["in1"][0]
    assert got["in0"][1] + 0.4 < got["in1"][1] < got["out0"][1] - 1.0, got  # in after the line, before engine0 ended
    assert 14.02 * GIB < handed <= 14.03 * GIB and handed % (10 * 2**20) == 0  # the logged size, rounded down
    # engine0's exact size replaced the logged one when its start ended
    assert KVSizes(args_of(model), VERSIONS, devices="9", gpus=H100).stored() == 10 * 16 * 12288


def test_no_hand_over_where_the_size_is_not_stored(model, tmp_path):
    sizes = KVSizes(args_of(model, kv_cache_dtype="fp8"), VERSIONS, devices="9", gpus=H100)
    with sizes.start_slot("engine0", timeout_s=5):
        assert sizes.hand_over(14.04) is None  # the lock stays held until the start ends
        other = KVSizes(args_of(model, kv_cache_dtype="fp8"), VERSIONS, devices="9", gpus=H100)
        with pytest.raises(EngineError, match="waited 0 s"):
            with other.start_slot("engine1", timeout_s=0.2):
                pass
    assert sizes.hand_over(14.04) is None  # after the start: nothing to hand over


def _learner_loads(devices: str, hold_s: float, q) -> None:
    import os

    from rlgen.gpustart import beside_engine_starts

    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    with beside_engine_starts("learner0", timeout_s=30):
        q.put(("learner in", time.time()))
        time.sleep(hold_s)
    q.put(("learner out", time.time()))


def test_a_learner_loading_on_the_gpu_and_a_measuring_engine_take_turns(model, tmp_path, monkeypatch, caplog):
    from rlgen.gpustart import beside_engine_starts

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    learner = ctx.Process(target=_learner_loads, args=("9", 1.0, q))
    learner.start()
    assert q.get(timeout=30)[0] == "learner in"
    sizes = KVSizes(args_of(model), VERSIONS, devices="9", gpus=H100)
    with sizes.start_slot("engine0", timeout_s=30) as stored:  # measures: waits for the learner's load
        entered = time.time()
        assert stored is None
        # a learner that comes while the engine measures waits for it, at most its timeout, then goes on
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "9")
        t0 = time.time()
        with beside_engine_starts("learner1", timeout_s=0.6):
            assert time.time() - t0 >= 0.6
        assert "learner1 waited 1 s for an engine on GPU(s) 9" in caplog.text
    left = dict(q.get(timeout=30) for _ in range(1))["learner out"]
    learner.join(30)
    assert entered >= left - 0.05


def test_an_engine_over_two_gpus_measures_only_once_the_learner_on_either_has_loaded(model, tmp_path, monkeypatch):
    from rlgen.gpustart import beside_engine_starts

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    learner = ctx.Process(target=_learner_loads, args=("9", 1.0, q))  # a colocated learner rank on the second GPU
    learner.start()
    assert q.get(timeout=30)[0] == "learner in"
    sizes = KVSizes(args_of(model, tensor_parallel_size=2), VERSIONS, devices="8,9", gpus=H100 * 2)
    with sizes.start_slot("engine0", timeout_s=30) as stored:
        entered = time.time()
        assert stored is None
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "8")  # the rank on the first GPU waits for the measurement
        t0 = time.time()
        with beside_engine_starts("learner0", timeout_s=0.6):
            assert time.time() - t0 >= 0.6
    left = q.get(timeout=30)[1]
    learner.join(30)
    assert entered >= left - 0.05


def test_the_visible_gpus_are_read_one_way(monkeypatch):
    from rlgen.bench.gpu import visible_gpus as bench_gpus
    from rlgen.engines.vllm.startup import visible_gpus
    from rlgen.gpustart import gpu_indices, visible_devices

    assert gpu_indices("0,3") == [0, 3] and gpu_indices("all") is None and gpu_indices("GPU-1a2b") is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert (visible_devices(), visible_gpus(), bench_gpus()) == ("all", [], None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert (visible_devices(), visible_gpus(), bench_gpus()) == ("2,5", [2, 5], [2, 5])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1a2b")
    assert (visible_gpus(), bench_gpus()) == ([], None)


def test_an_engine_given_its_size_starts_beside_a_loading_learner_and_keeps_a_measurement_out(model, monkeypatch):

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    learner = ctx.Process(target=_learner_loads, args=("9", 2.0, q))
    learner.start()
    assert q.get(timeout=30)[0] == "learner in"
    given = KVSizes(args_of(model, kv_cache_memory_bytes=2 * GIB), VERSIONS, devices="9", gpus=H100)
    t0 = time.time()
    with given.start_slot("engine0", timeout_s=30, given=True) as stored:
        assert time.time() - t0 < 1.0  # no wait for the learner's load
        assert stored is None  # nothing was measured on this setup
        measuring = KVSizes(args_of(model), VERSIONS, devices="9", gpus=H100)
        with pytest.raises(EngineError, match="waited 0 s"):  # an engine that measures still starts alone
            with measuring.start_slot("engine1", timeout_s=0.3):
                pass
    learner.join(30)
    assert q.get(timeout=30)[0] == "learner out"
