"""The step-time prediction against a hand calculation, its calibration, and its limits."""

from __future__ import annotations

import functools
import io
import json
import subprocess
import sys

import pytest
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.metrics.balance import Kind
from rlgen.plan import build_plan, prediction
from rlgen.plan.prediction import predict, print_prediction

# Qwen2.5-1.5B on 8xH100 (4 engine GPUs, 4 learner GPUs), 64 prompts x 8 samples, 128 + 512 tokens.
GPU_RUN = (
    "hardware=8xh100",
    "hardware.engine_gpus=4",  # the split the hand calculation is of (left null, the plan picks hybrid)
    "engine=vllm",
    "model=qwen2_5_1_5b",
    "algo.max_new_tokens=512",
    "task.max_prompt_tokens=128",
    "algo.prompts_per_step=64",
    "algo.async_steps=0",  # the hand calculation is of a step that runs generation and training in turn
)


@functools.cache
def _predict(*overrides: str, tokens: int = 10240):
    # micro-batches of 10,240 packed tokens: 16 rows of 640 tokens, the hand calculation's
    cfg = compose_run_config([f"algo.micro_batch_tokens={tokens}", *overrides])
    return predict(build_plan(cfg))


def test_hand_calculation_qwen2_5_1_5b_on_8xh100():
    p = _predict(*GPU_RUN)
    assert p.available
    # The preset: 1,543,714,304 params; KV = 2 (k, v) x 28 layers x 2 KV heads x 128 head dim x 2 bytes.
    params, kv, layers, hidden = 1_543_714_304, 2 * 28 * 2 * 128 * 2, 28, 1536
    assert kv == 28_672
    weights = 2 * params  # bf16, 3.09 GB
    # KV capacity of one H100 engine: 80 GB x 0.9 - 1 GiB headroom - weights, over 28,672 bytes a token.
    kv_tokens = int((80e9 * 0.9 - 2**30 - weights) // kv)
    assert p.kv_capacity_tokens == kv_tokens == 2_366_030
    assert p.max_concurrency == 2048  # engine.max_num_seqs; KV would hold 3,696 640-token sequences
    # 64 prompts dealt over 4 engines: 16 groups x 8 samples = 128 sequences per engine, one wave.
    c, ctx = 128, 128 + 512 / 2
    assert p.concurrency == c
    hbm = 3.35e12 * 0.90  # spec x measured copy efficiency
    mm = 989e12 * 0.80  # spec x measured matmul efficiency
    t_mem = (weights + c * ctx * kv) / hbm  # 4.50 GB a step -> 1.49 ms
    t_cmp = c * (2 * params + 4 * layers * hidden * ctx) / mm  # 0.51 ms: memory-bound
    assert t_mem == pytest.approx(1.4914e-3, rel=1e-3)
    assert p.decode_bound == "memory"
    # Calibration (0.5B, 1024 in flight, mean context 384): (0.988 GB weights + 1024 x 384 x 12,288 B KV)
    # / 3.015 TB/s = 1.930 ms a step = 1.885 us a token; measured 1 / 19,600 = 51.02 us a token.
    calib_roof = (2 * 494_032_768 + 1024 * 384 * 12_288) / hbm / 1024
    assert calib_roof == pytest.approx(1.885e-6, rel=1e-3)
    overhead = 1 / 19_600 - calib_roof
    step = t_mem + c * overhead  # 7.78 ms
    assert p.decode_step_s == pytest.approx(step, rel=1e-9)
    assert p.roofline_tokens_per_s == pytest.approx(c / t_mem, rel=1e-6)
    gen = 512 * step + c * 128 * 2 * params / mm  # decode + prefill = 4.05 s
    assert p.gen_s == pytest.approx(gen, rel=1e-9)
    assert p.gen_s == pytest.approx(4.05, abs=0.01)
    # Learner: 128 rows of 640 tokens a rank, packed in 8 micro-batches of 10,240 tokens, each 6 x params x 10,240 at 21%
    # of 989 TFLOP/s = 0.457 s, above the 28 x 12.7 ms = 0.356 s launch floor: 3.65 s.
    micro = 6 * params * 16 * 640 / (989e12 * 0.21)
    assert micro > 28 * 0.0127
    train = 8 * micro
    assert p.train_s == pytest.approx(train, rel=1e-9)
    assert p.train_s == pytest.approx(3.654, abs=0.001)
    sync = weights / 107e9  # NCCL broadcast, 29 ms
    assert p.sync_s == pytest.approx(sync, rel=1e-9)
    # On-policy: the step is the sum; generation takes 1.1x as long as training -> balanced, and the advice is
    # to overlap the two.
    assert p.step_s == pytest.approx(gen + train + sync, rel=1e-9)
    v = p.verdict
    assert v.kind == Kind.balanced.value
    assert v.ratio == pytest.approx((gen + sync) / (train + sync), rel=1e-9)
    assert "async_steps to 1" in v.advice
    assert t_cmp < t_mem


def test_calibration_reproduces_the_measured_decode_rate():
    """vLLM, 0.5B, one H100, 1024 sequences in flight, 128 + 512 tokens: 19.6k tok/s with logprobs."""
    assert 45e-6 < prediction.DECODE_OVERHEAD_S_PER_TOKEN < 52e-6
    p = _predict(
        "hardware=1xh100", "engine=vllm", "model=qwen2_5_0_5b", "engine.max_num_seqs=1024",
        "algo.prompts_per_step=128", "algo.samples_per_prompt=8", "task.max_prompt_tokens=128",
        "algo.max_new_tokens=512",
    )
    assert p.concurrency == 1024
    assert p.engine_tokens_per_s == pytest.approx(prediction.CALIBRATION_TOKENS_PER_S, rel=1e-9)
    assert p.roofline_tokens_per_s > 20 * p.engine_tokens_per_s  # overhead-bound, as measured


def test_async_overlaps_and_colocated_only_when_awake():
    sync = _predict(*GPU_RUN)
    ahead = _predict(*GPU_RUN, "algo.async_steps=1")
    assert _predict(*GPU_RUN[:-1]).step_s == ahead.step_s  # left null, vLLM engines on GPUs run one step ahead
    assert ahead.step_s == pytest.approx(max(sync.gen_s, sync.train_s) + sync.sync_s, rel=1e-9)
    assert ahead.verdict.learner_wait_s == pytest.approx(sync.gen_s - sync.train_s, rel=1e-9)
    assert ahead.verdict.engine_idle_s == 0
    colo = _predict("hardware=1xh100", "engine=vllm", "model=qwen2_5_1_5b",
                    "algo.max_new_tokens=512", "task.max_prompt_tokens=128", "algo.async_steps=0")
    assert colo.step_s == pytest.approx(colo.gen_s + colo.train_s + colo.sync_s, rel=1e-9)
    awake = _predict("hardware=1xh100", "engine=vllm", "model=qwen2_5_1_5b", "algo.max_new_tokens=512",
                     "task.max_prompt_tokens=128", "algo.async_steps=1")
    # awake beside the training learner, the engines take turns with it on the GPU: the step is the sum, as
    # measured (46.4 s overlapped against 23.4 s + 24.3 s alone on one H100)
    assert awake.step_s == pytest.approx(awake.gen_s + awake.train_s + awake.sync_s, rel=1e-9)
    assert any("share each GPU" in n for n in awake.notes)


def test_kv_capacity_limits_concurrency():
    p = _predict("hardware=8xh200", "engine=vllm", "model=qwen2_5_7b", "engine.max_num_seqs=4096",
                 "engine.max_model_len=32768", "algo.max_new_tokens=16384", "task.max_prompt_tokens=1024",
                 "algo.prompts_per_step=512", tokens=17408)
    assert p.max_concurrency == p.kv_capacity_tokens // (1024 + 16384) < 4096
    assert p.concurrency == p.max_concurrency


def test_training_bound_with_a_reference_model_and_few_tokens():
    p = _predict(*GPU_RUN[:-3], "algo.max_new_tokens=16", "task.max_prompt_tokens=1024", "algo.kl_coef=0.1")
    assert "8 x params" in p.sources["train_s"]
    assert p.verdict.kind == Kind.training_bound.value


def test_cpu_has_no_roofline():
    p = _predict()
    assert not p.available
    assert "no roofline for CPU" in p.reason
    buf = io.StringIO()
    print_prediction(p, Console(file=buf, width=200))
    assert "no roofline for CPU" in buf.getvalue()


def test_printed_prediction_names_its_sources():
    buf = io.StringIO()
    print_prediction(_predict(*GPU_RUN), Console(file=buf, width=250))
    text = buf.getvalue()
    for needle in ("KV capacity", "decode step", "calibrated", "measured", "predicted: balanced"):
        assert needle in text
    json.dumps(_predict(*GPU_RUN).to_dict(), allow_nan=False)


def test_learner_mfu_interpolates_between_measured_shapes():
    assert prediction.learner_mfu(64) == 0.13
    assert prediction.learner_mfu(896) == 0.13
    assert 0.13 < prediction.learner_mfu(1024) < 0.21
    assert prediction.learner_mfu(3584) == 0.21


def test_small_micro_batches_hit_the_launch_floor():
    """As measured on one H100 (1.5B, 128 rows of 312 tokens a rank): 8-row micro-batches are bound by the CPU
    work each one costs, so the step is 16 floors (5.69 s measured); 32-row ones by the GPU (1.77 s measured)."""
    base = ("hardware=4xh100", "engine=vllm", "model=qwen2_5_1_5b", "hardware.colocated=true",
            "algo.max_new_tokens=256", "task.max_prompt_tokens=56")
    small = predict(build_plan(compose_run_config([*base, "algo.micro_batch_tokens=2496"])))  # 8 rows of 312
    large = predict(build_plan(compose_run_config([*base, "algo.micro_batch_tokens=9984"])))  # 32 rows
    assert small.train_s == pytest.approx(16 * 28 * 0.0127, rel=1e-9)  # 5.69 s
    assert 1.4 < large.train_s < 2.1
    no_ckpt = predict(build_plan(compose_run_config([*base, "algo.micro_batch_tokens=9984",
                                                    "learner.gradient_checkpointing=false"])))
    assert no_ckpt.train_s == pytest.approx(large.train_s / prediction.NO_CHECKPOINTING_SPEEDUP, rel=1e-9)


def test_planner_and_balancer_stay_light():
    code = (
        "import sys, rlgen.plan.prediction, rlgen.metrics.balance; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'vllm', 'matplotlib'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
