"""Weight sync on GPUs through vLLM's transfer engines: weights really move, outputs really change.

- NCCL (2 GPUs): a learner actor on one GPU broadcasts into a VLLMEngine actor on the other.
- CUDA IPC (1 GPU): learner and engine share the GPU; the engine sleeps (level 1, then 2), wakes its
  weights, reads the learner's resident buffer through its IPC handle, wakes its KV cache; then the same
  awake, with an update in flight.
- DeepSpeed ZeRO-3 (1 GPU, or 2 with NCCL): a step changes parameters; the gathered weights reach an engine.

Each check swaps in a second random model and then swaps the first back: greedy outputs must change, then
come back exactly. Every actor runs under Ray, as in a run. Slow: each engine start is ~1 min.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from helpers import SMALL_QWEN2, algo_cfg, save_small_qwen2
from rlgen.config import EngineConfig, MonitorConfig
from rlgen.engines.vllm.args import engine_args_for
from rlgen.runtime.start.transport import make_transport
from rlgen.sync.sender import WeightSender
from rlgen.types import GenRequest, SamplingParams

pytestmark = pytest.mark.gpu
VOCAB = SMALL_QWEN2["vocab_size"]
TIMEOUT_S = 300.0



def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


needs_two = pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs on one host")
needs_ds = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, str]:
    return save_small_qwen2(tmp_path_factory.mktemp("a"), 0), save_small_qwen2(tmp_path_factory.mktemp("b"), 1)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "HF_", "PYTHONPATH", "NCCL_"))}
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    env.setdefault("NCCL_CUMEM_ENABLE", "0")  # vLLM's workers run with it off; the learner side must match
    # the stand-in actor classes below live in this module, which Ray's workers import by name
    here = os.path.dirname(os.path.abspath(__file__))  # and tests/, for the helpers module they import
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.path.dirname(here), env.get("PYTHONPATH", "")) if p)
    ray.init(address="local", include_dashboard=False, runtime_env={"env_vars": env})
    yield ray
    ray.shutdown()


class SwapLearner(WeightSender):
    """A learner stand-in: holds one of two bf16 models on its GPU and can switch between them."""

    def __init__(self, paths: tuple[str, str]):
        import torch
        from transformers import AutoModelForCausalLM

        self.device, self.name, self.version = torch.device("cuda", 0), "learner0", 0
        self.models = [AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16).to(self.device) for p in paths]
        self.model = self.models[0]

    def use(self, index: int, version: int) -> None:
        self.model, self.version = self.models[index], version


def _engine(ray, path: str, transport, num_gpus: float, options=None, **cfg):
    from rlgen.engines.vllm.engine import VLLMEngine

    ecfg = EngineConfig(kind="vllm", max_model_len=512, max_num_seqs=64, enforce_eager=True, **cfg)
    return ray.remote(VLLMEngine).options(num_gpus=num_gpus, max_concurrency=4, **(options or {})).remote(
        path, ecfg, device="cuda", name="engine0", engine_args=engine_args_for(transport))


@pytest.fixture
def shared_gpu(ray_local):
    """Scheduling options that put an actor in one placement-group bundle holding one GPU. The group is removed
    after the test: on a one-GPU host it would otherwise hold the only GPU, and the next test's actor would wait
    for it for ever."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 2, "GPU": 1}], strategy="STRICT_PACK")
    ray_local.get(pg.ready(), timeout=TIMEOUT_S)
    yield {"scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)}
    remove_placement_group(pg)


def _greedy(ray, engine) -> list[list[int]]:
    import random

    rng = random.Random(0)
    reqs = [GenRequest(tuple(rng.randrange(3, VOCAB) for _ in range(12)),
                       SamplingParams(n=1, temperature=0.0, max_new_tokens=16, ignore_eos=True), group_id=i)
            for i in range(8)]
    out = ray.get(engine.generate.remote(reqs), timeout=TIMEOUT_S)
    return [c.token_ids for c in out.completions]


def _transport(kind: str, async_steps: int = 0, overrides: tuple[str, ...] = (), **kw):
    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan

    hw = (["hardware=2xh200", "hardware.colocated=false"] if kind == "nccl" else  # engine and learner on GPUs of
          # their own (the plan's own pick on two GPUs is hybrid, over CUDA IPC); colocated: the sleep/wake cycle, or
          # awake engines
          ["hardware=1xh100", "engine.gpu_memory_utilization=0.3", f"algo.async_steps={async_steps}",
           "engine.engines_per_gpu=1"])  # the one engine these tests start
    cfg = compose_run_config(["engine=vllm", *hw, f"timeout_s={TIMEOUT_S}", *overrides])
    plan = build_plan(cfg)
    return make_transport(plan, plan.config, bucket_mb=64, **kw)


def _swap_round_trip(ray, transport, learner, engine, sleep_engines=lambda: None):
    base = _greedy(ray, engine)
    ray.get(learner.use.remote(1, 1))
    sleep_engines()
    res = transport.push(1)
    assert res.version == 1 and ray.get(engine.health.remote())["version"] == 1
    swapped = _greedy(ray, engine)
    assert swapped != base, "outputs did not change after syncing a different model"
    ray.get(learner.use.remote(0, 2))
    sleep_engines()
    transport.push(2)
    assert _greedy(ray, engine) == base, "syncing the original weights back did not restore the outputs"
    return res


@needs_two
def test_nccl_moves_weights_into_a_running_engine(ray_local, models):
    ray = ray_local
    engine = _engine(ray, models[0], "nccl", 1, gpu_memory_utilization=0.5)
    learner = ray.remote(SwapLearner).options(num_gpus=1).remote(models)
    transport = _transport("nccl")
    transport.setup(learner, [engine], ["engine0"])
    res = _swap_round_trip(ray, transport, learner, engine)
    print(f"nccl push: {res.seconds:.3f} s for 2 models' worth of tensors")
    # in flight: requests paused with their KV cache, updated, resumed
    ref = engine.generate.remote([GenRequest((5, 6, 7), SamplingParams(n=4, max_new_tokens=256, ignore_eos=True), 0)])
    ray.get(learner.use.remote(1, 3))
    transport.push(3, in_flight=True)
    assert all(len(c.token_ids) == 256 for c in ray.get(ref, timeout=TIMEOUT_S).completions)
    for actor in (engine, learner):
        ray.kill(actor)


def test_cuda_ipc_moves_weights_between_colocated_actors(ray_local, models, shared_gpu):
    ray = ray_local
    shared = shared_gpu  # both actors on the same physical GPU, as in a colocated plan
    engine = _engine(ray, models[0], "cuda_ipc", 0.5, shared, gpu_memory_utilization=0.3, enable_sleep_mode=True)
    learner = ray.remote(SwapLearner).options(num_gpus=0.5, num_cpus=1, **shared).remote(models)
    for level in (1, 2):  # level 2 drops the weights: they come back through vLLM's layerwise reload
        transport = _transport("cuda_ipc", sleep_level=level)
        transport.setup(learner, [engine], ["engine0"])
        _swap_round_trip(ray, transport, learner, engine, sleep_engines=transport.sleep_engines)
    # awake (async_steps>0): no sleep; an update in flight pauses the requests for the loads only
    transport = _transport("cuda_ipc", async_steps=1)
    assert transport.awake
    transport.setup(learner, [engine], ["engine0"])
    res = _swap_round_trip(ray, transport, learner, engine)
    [sent] = [r for r in res.results if r["actor"] == "learner0"]
    print(f"ipc push (awake): {res.seconds:.3f} s, learner parts {sent['parts']}, {sent['chunks']} chunk(s)")
    ref = engine.generate.remote([GenRequest((5, 6, 7), SamplingParams(n=4, max_new_tokens=256, ignore_eos=True), 0)])
    ray.get(learner.use.remote(1, 3))
    res = transport.push(3, in_flight=True)
    assert all(len(c.token_ids) == 256 for c in ray.get(ref, timeout=TIMEOUT_S).completions)
    [(_, a, b)] = [r["spans"] for r in res.results if r["actor"] == "engine0"][0]
    print(f"ipc push in flight: {res.seconds:.3f} s, engine paused {b - a:.3f} s")
    assert ray.get(engine.health.remote())["version"] == 3 and not ray.get(engine.health.remote())["paused"]
    _tokens_know_their_version(ray, transport, learner, engine)
    for actor in (engine, learner):
        ray.kill(actor)


def _greedy_one(ray, engine, prompt: tuple[int, ...], n: int):
    req = GenRequest(prompt, SamplingParams(n=1, temperature=0.0, max_new_tokens=n, ignore_eos=True), group_id=0)
    return engine.generate.remote([req])


def _tokens_know_their_version(ray, transport, learner, engine, new_tokens: int = 400):
    """Greedy decoding under model A with model B pushed in flight: the completion names the first token after
    the update, and that is where it first departs from A's own greedy output. (The tokens after it are not a
    fresh B's continuation of the prefix: the paused request keeps the KV cache A computed for it.)"""
    import time

    prompt = (5, 6, 7)
    ray.get(learner.use.remote(0, 4))
    transport.push(4)
    [a] = ray.get(_greedy_one(ray, engine, prompt, new_tokens), timeout=TIMEOUT_S).completions
    ref = _greedy_one(ray, engine, prompt, new_tokens)
    time.sleep(0.2)  # let decoding start
    ray.get(learner.use.remote(1, 5))
    transport.push(5, in_flight=True)
    [mixed] = ray.get(ref, timeout=TIMEOUT_S).completions
    assert mixed.version == 4 and len(mixed.version_changes) == 1, mixed.version_changes
    [(k, version)] = mixed.version_changes
    print(f"in-flight update after {k} of {new_tokens} tokens")
    assert version == 5 and 0 <= k < new_tokens
    departs = next((i for i, (x, y) in enumerate(zip(mixed.token_ids, a.token_ids)) if x != y), new_tokens)
    assert departs == k, f"the update is marked at token {k}, but the output departs from model A's at {departs}"


def _rollout_batch(seed: int = 0):
    import torch

    from rlgen.types import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    n, p, length = 8, 12, 16
    ids = torch.randint(3, VOCAB, (n, p + length), generator=g)
    return RolloutBatch(input_ids=ids, attention_mask=torch.ones(n, p + length, dtype=torch.long),
                        response_mask=torch.ones(n, length), engine_logprobs=torch.full((n, length), -7.0),
                        rewards=torch.arange(n).float() % 2, advantages=(torch.arange(n).float() % 2) * 2 - 1,
                        group_ids=torch.arange(n) // 4, version=0, prompt_len=p)


@needs_ds
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_step_changes_parameters(ray_local, models, stage):
    import torch

    from rlgen.learners.deepspeed import DeepSpeedLearner

    ray = ray_local
    # lr 1e-2: a smaller step can round away in the bf16 copy of weights near 1 (the norms), spacing 2^-7
    algo = algo_cfg(lr=1e-2, micro_batch_tokens=64, prompts_per_step=2, samples_per_prompt=4)
    learner = ray.remote(DeepSpeedLearner).options(num_gpus=1).remote(models[0], algo, MonitorConfig(),
                                                                       zero_stage=stage)
    before = ray.get(learner.get_weights.remote(), timeout=TIMEOUT_S)
    out = ray.get(learner.train_step.remote(_rollout_batch()), timeout=TIMEOUT_S).record()
    after = ray.get(learner.get_weights.remote(), timeout=TIMEOUT_S)
    assert out["skipped"] is False and out["version"] == 1, out
    assert {k: tuple(v.shape) for k, v in before.items()} == {k: tuple(v.shape) for k, v in after.items()}
    changed = sum(not torch.equal(before[k], after[k]) for k in before)
    assert changed == len(before), f"{changed} of {len(before)} tensors changed"
    ray.kill(learner)


@needs_ds
def test_fp16_learner_weights_reach_a_float16_engine(ray_local, models, shared_gpu):
    """precision=fp16's weight path: DeepSpeed's fp16 learner trains (an overflow skip of its first scales aside)
    and its float16 weights go over CUDA IPC into a float16 vLLM engine, whose outputs change."""
    from rlgen.learners.deepspeed import DeepSpeedLearner

    ray = ray_local
    engine = _engine(ray, models[0], "cuda_ipc", 0.5, shared_gpu, gpu_memory_utilization=0.3, dtype="float16",
                     enable_sleep_mode=True)
    algo = algo_cfg(lr=1e-2, micro_batch_tokens=64, prompts_per_step=2, samples_per_prompt=4)
    learner = ray.remote(DeepSpeedLearner).options(num_gpus=0.5, **shared_gpu).remote(
        models[0], algo, MonitorConfig(), zero_stage=2, precision="fp16")
    transport = _transport("cuda_ipc", async_steps=1, overrides=("precision=fp16",))
    assert transport.dtype == "float16"
    transport.setup(learner, [engine], ["engine0"])
    base = _greedy(ray, engine)
    applied = 0
    for step in range(6):
        out = ray.get(learner.train_step.remote(_rollout_batch(step)), timeout=TIMEOUT_S).record()
        assert not out["skipped"] or out.get("overflow_skip"), out  # an overflow, never a non-finite step
        applied += not out["skipped"]
        if not out["skipped"]:
            transport.push(out["version"])
    weights = ray.get(learner.get_weights.remote("float16"), timeout=TIMEOUT_S)
    assert applied >= 3 and all(str(t.dtype) == "torch.float16" for t in weights.values())
    assert _greedy(ray, engine) != base
    for actor in (engine, learner):
        ray.kill(actor)


@needs_ds
@needs_two
def test_deepspeed_zero3_weights_reach_the_engine_over_nccl(ray_local, models):
    from rlgen.learners.deepspeed import DeepSpeedLearner

    ray = ray_local
    engine = _engine(ray, models[0], "nccl", 1, gpu_memory_utilization=0.5)
    algo = algo_cfg(lr=1e-2, prompts_per_step=2, samples_per_prompt=4)
    learner = ray.remote(DeepSpeedLearner).options(num_gpus=1).remote(models[0], algo, MonitorConfig(), zero_stage=3)
    transport = _transport("nccl")
    transport.setup(learner, [engine], ["engine0"])
    base = _greedy(ray, engine)
    for step in range(3):  # a large lr on random rollouts: the policy moves visibly
        out = ray.get(learner.train_step.remote(_rollout_batch(step)), timeout=TIMEOUT_S).record()
        assert not out["skipped"], out
        res = transport.push(out["version"])
    print(f"zero-3 gather + nccl push: {res.seconds:.3f} s")
    assert _greedy(ray, engine) != base
    for actor in (engine, learner):
        ray.kill(actor)
