"""`rlgen bench`'s vllm side with bench.engines_per_gpu > 1, on Ray with one pretend GPU: the engines share it,
start at once (a vLLM engine takes turns only to measure its KV cache, inside the engine), split the requests
and generate at once, and the checks cover every engine's part.
A stand-in engine replaces VLLMEngine; what it returns is what vLLM would (n completions of max_tokens each)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rlgen.config import BenchConfig, EngineConfig
from rlgen.generated import GenResult
from rlgen.types import Completion

ray = pytest.importorskip("ray")

GENERATE_S = 2.0
START_S = 3.0  # longer than a worker process takes to start on a loaded machine, so the two starts overlap


class StandInEngine:
    """model_path is a folder where each engine writes what it was given and when it started."""

    def __init__(self, model_path, engine, device="cuda", seed=0, name="engine0", env=None, engine_args=None):
        self.began = time.time()
        time.sleep(START_S)  # an engine start that takes a while: the other starts meanwhile
        self.name, self.folder, self.prompts = name, Path(model_path), []
        self.ended = time.time()
        self._note(share=engine.gpu_memory_utilization,
                   gpu=ray.get_runtime_context().get_assigned_resources().get("GPU"))

    def _note(self, **facts):
        path = self.folder / f"{self.name}.json"
        old = json.loads(path.read_text()) if path.exists() else {"began": self.began, "ended": self.ended}
        path.write_text(json.dumps({**old, **facts}))

    def health(self):
        return {"ok": True, "name": self.name, "start_s": self.ended - self.began}

    def generate(self, requests):
        a = time.time()
        time.sleep(GENERATE_S)
        self.prompts.extend(r.group_id for r in requests)
        self._note(prompts=sorted(set(self.prompts)))
        comps = [Completion(r.group_id, list(r.prompt_ids), [7] * r.sampling.max_new_tokens,
                            [-0.5] * r.sampling.max_new_tokens, "length", 0)
                 for r in requests for _ in range(r.sampling.n)]
        return GenResult(completions=comps, version=0, spans=[("generate", a, time.time())])

    def shutdown(self):
        return None


@pytest.fixture(scope="module")
def one_pretend_gpu():
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    if ray.is_initialized():
        ray.shutdown()
    # a cluster of its own ("local"), whatever other tests or a `ray start` left running
    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_two_engines_share_one_gpu_start_together_split_the_prompts_and_run_at_once(one_pretend_gpu, tmp_path):
    from rlgen.bench import sides
    from rlgen.bench.workload import make_workload

    reqs = make_workload(BenchConfig(num_prompts=6, samples_per_prompt=2, prompt_len=4, response_len_min=3,
                                     response_len_max=9), 100)
    engine = EngineConfig(kind="vllm", gpu_memory_utilization=0.8)
    mem = sides.MemorySampler()
    try:
        rec = sides.run_vllm_side(str(tmp_path), engine, reqs, mem, per_gpu=2, repeats=2, engine_cls=StandInEngine)
    finally:
        mem.close()
    assert "error" not in rec, rec
    first, second = (json.loads((tmp_path / f"vllm{i}.json").read_text()) for i in range(2))
    assert first["gpu"] == second["gpu"] == 0.5  # both on the one GPU
    assert first["share"] == second["share"] == 0.4 == rec["gpu_memory_utilization_each"]
    assert second["began"] < first["ended"] and first["began"] < second["ended"]  # their starts overlap
    assert first["prompts"] == [0, 2, 4] and second["prompts"] == [1, 3, 5]
    assert rec["engines_per_gpu"] == 2
    assert rec["n_ok"] and rec["lengths_ok"] and rec["logprobs_ok"]
    assert rec["tokens"] == sum(2 * r.sampling.max_new_tokens for r in reqs)
    # both generate at once: each call takes GENERATE_S, the pair well under twice that
    assert len(rec["runs"]) == 2 and all(run["wall_s"] < 1.8 * GENERATE_S for run in rec["runs"]), rec["runs"]


def test_one_engine_per_gpu_is_the_side_as_before(one_pretend_gpu, tmp_path):
    from rlgen.bench import sides
    from rlgen.bench.workload import make_workload

    reqs = make_workload(BenchConfig(num_prompts=3, samples_per_prompt=2, prompt_len=4, response_len_min=2,
                                     response_len_max=4), 100)
    mem = sides.MemorySampler()
    try:
        rec = sides.run_vllm_side(str(tmp_path), EngineConfig(kind="vllm", gpu_memory_utilization=0.8),
                                  reqs, mem, engine_cls=StandInEngine)
    finally:
        mem.close()
    assert "error" not in rec and "engines_per_gpu" not in rec
    only = json.loads((tmp_path / "vllm.json").read_text())
    assert only["gpu"] == 1.0 and only["share"] == 0.8 and only["prompts"] == [0, 1, 2]
    assert rec["n_ok"] and rec["lengths_ok"] and rec["tokens"] == sum(2 * r.sampling.max_new_tokens for r in reqs)


def test_a_shared_gpu_with_tensor_parallel_engines_is_refused():
    from rlgen.bench import sides
    from rlgen.bench.workload import BenchError

    engine = EngineConfig(kind="vllm", tensor_parallel_size=2)
    with pytest.raises(BenchError, match="tensor_parallel_size=1"):
        sides.run_vllm_side("unused", engine, [], None, per_gpu=2, engine_cls=StandInEngine)
