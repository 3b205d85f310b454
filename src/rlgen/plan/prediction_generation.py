"""The engines' side of a predicted step (rlgen.plan.prediction): the roofline of a decode step with the per-token
overhead calibrated on vLLM, an engine's KV capacity, the generation time of a batch on the busiest engine, and,
where the lengths have a tail, that time without and with partial rollouts. Pure Python."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlgen.config import RunConfig
from rlgen.config.cards import card
from rlgen.plan import ENGINE_HEADROOM_GIB, GIB, Plan
from rlgen.plan.lengths import awaited_response, longest_response, shaped_decode_s
from rlgen.plan.placement import gpu_group

BF16_BYTES = 2

# What a program gets of the spec figures in hardware.gpu (peak bf16 TFLOP/s, HBM TB/s).
# bf16 8192^3 torch matmul on random data: 798 TFLOP/s on an H100 SXM, 769-798 on an H200 (torch 2.11+cu130);
# 771 on the H100 in the learner measurement (rlgen.plan.prediction). 790 / 989 spec = 0.80.
MATMUL_EFFICIENCY = 0.80
# Device-to-device copy, bytes read + written: about 3.0 TB/s of the 3.35 spec on an H100 (2.6 in one run
# here) and 4.3 of the 4.8 spec on an H200: about 0.90 of spec.
HBM_EFFICIENCY = 0.90

# Decode calibration: vLLM (random weights, Qwen2.5-0.5B shape) on one H100 generated 128 prompts x 8 samples
# x 512 new tokens at 26.1k tokens/s without logprobs and 19.6k with logprobs=0, which is what rlgen asks
# for. The roofline part of that workload is under 2 us a token, so almost all of the measured ~51 us a
# token is per-token engine work (scheduling, sampling over a 152k vocabulary, logprobs, output processing);
# we keep it as a fixed per-token overhead per engine, worked out below from the measurement. Assumed for
# the calibration: 128-token prompts (rlgen bench's default) and all 1024 sequences in flight (vLLM's default
# max_num_seqs for its LLM class on 80 GB GPUs); with 256 in flight the overhead moves by under 3%.
CALIBRATION_TOKENS_PER_S = 19_600.0
CALIBRATION_TOKENS_PER_S_NO_LOGPROBS = 26_100.0
CALIBRATION_SHAPE = {
    "params": 494_032_768,
    "layers": 24,
    "hidden": 896,
    "kv_bytes_per_token": 12_288,
    "prompt_tokens": 128,
    "response_tokens": 512,
    "concurrency": 1024,
    "hbm_tbps": card("h100").spec.hbm_tbps,
    "bf16_tflops": card("h100").spec.bf16_tflops,
}


def step_time(c: float, ctx: float, params: float, layers: int, hidden: int, kv_bytes: float, tp: int,
              hbm_tbps: float, tflops: float) -> tuple[float, float, float]:
    """(memory-bound s, compute-bound s) of one decode step of c sequences, and its roofline time."""
    bytes_ = (params * BF16_BYTES + c * ctx * kv_bytes) / tp
    flops = c * (2 * params + 4 * layers * hidden * ctx) / tp
    t_mem = bytes_ / (hbm_tbps * 1e12 * HBM_EFFICIENCY)
    t_cmp = flops / (tflops * 1e12 * MATMUL_EFFICIENCY)
    return t_mem, t_cmp, max(t_mem, t_cmp)


def _calibrated_overhead() -> float:
    s = CALIBRATION_SHAPE
    ctx = s["prompt_tokens"] + s["response_tokens"] / 2
    _, _, t = step_time(s["concurrency"], ctx, s["params"], s["layers"], s["hidden"], s["kv_bytes_per_token"], 1,
                        s["hbm_tbps"], s["bf16_tflops"])
    return 1.0 / CALIBRATION_TOKENS_PER_S - t / s["concurrency"]


DECODE_OVERHEAD_S_PER_TOKEN = _calibrated_overhead()  # about 49 us

# A decode step of few sequences, as in a batch's tail: vLLM's scheduler and output handling took about 6 ms a decode
# step for 64 sequences of the 0.5B shape (64 + 256 tokens, one engine alone on an H100, 32k vocabulary;
# docs/benchmarks.md, "What one decode step costs at the 0.5B shape"), where the per-token overhead above gives
# 3.4 ms. A step's overhead of a + k x b through both measurements (k = 64 and the calibration's 1024) splits it into
# about 2.6 ms a step and 46 us a token. RL-shaped lengths (plan.lengths), whose tail runs many decode steps of few
# sequences each, are modelled with the split; fixed lengths keep the per-token figure measured at full concurrency.
STEP_CALIBRATION = {"concurrency": 64, "prompt_tokens": 64, "response_tokens": 256, "step_s": 6e-3}


def _step_split() -> tuple[float, float]:
    """(the fixed CPU seconds of a decode step, the seconds each sequence in it adds) through the two measurements."""
    s, low_point = CALIBRATION_SHAPE, STEP_CALIBRATION

    def overhead(k: int, prompt: float, resp: float, step_s: float) -> float:
        _, _, roof = step_time(k, prompt + resp / 2, s["params"], s["layers"], s["hidden"], s["kv_bytes_per_token"], 1,
                               s["hbm_tbps"], s["bf16_tflops"])
        return step_s - roof

    k_high, k_low = s["concurrency"], low_point["concurrency"]
    high = overhead(k_high, s["prompt_tokens"], s["response_tokens"], k_high / CALIBRATION_TOKENS_PER_S)
    low = overhead(k_low, low_point["prompt_tokens"], low_point["response_tokens"], low_point["step_s"])
    per_token = (high - low) / (k_high - k_low)
    return low - k_low * per_token, per_token


DECODE_STEP_CPU_S, DECODE_TOKEN_CPU_S = _step_split()  # about 2.6 ms and 46 us
CALIBRATED_ON = "vllm"  # the engine kind the decode overhead was measured on; others get a note


@dataclass(frozen=True)
class Generation:
    """The engines' side of a step, for the busiest engine."""

    num_engines: int  # GPU groups: engines sharing a GPU count as one
    shared: bool  # several engines on one GPU
    prompt: float
    resp: float
    kv_tokens: int
    max_conc: int
    seqs_engine: int
    concurrency: int
    t_mem: float
    t_cmp: float
    t_step: float
    gen_s: float
    batch_tokens: float  # response tokens of the whole batch


def engine_capacity(plan: Plan, cfg: RunConfig) -> tuple[int, int]:
    """KV capacity of one engine (all its GPUs) in tokens, and how many sequences fit at full length."""
    gpu, e, b = cfg.hardware.gpu, cfg.engine, plan.batch
    tp = plan.engines[0].tensor_parallel_size
    share = gpu.memory_gb * 1e9 * e.gpu_memory_utilization - ENGINE_HEADROOM_GIB * GIB  # less the weights below
    usable = tp * e.kv_cache_gib * GIB if e.kv_cache_gib else tp * share - plan.model.params * BF16_BYTES
    kv_tokens = max(0, int(usable // plan.model.kv_bytes_per_token))
    max_conc = min(e.max_num_seqs, kv_tokens // max(b.max_seq_len, 1))
    return kv_tokens, max_conc


def decode_step(k: int, ctx: float, plan: Plan, cfg: RunConfig) -> tuple[float, float, float]:
    """(memory-bound s, compute-bound s) of one engine's decode step of k sequences, and its time with the
    per-token engine overhead."""
    m, gpu = cfg.model, cfg.hardware.gpu
    t_mem, t_cmp, t = step_time(k, ctx, plan.model.params, m.num_layers, m.hidden_size,
                                plan.model.kv_bytes_per_token, plan.engines[0].tensor_parallel_size,
                                gpu.hbm_tbps, gpu.bf16_tflops)
    return t_mem, t_cmp, t + k * DECODE_OVERHEAD_S_PER_TOKEN


def decode_split(c: int, ctx: float, plan: Plan, cfg: RunConfig) -> tuple[float, float]:
    """One engine's decode step of c sequences split in two: its fixed part (the weights read once and the
    engine's CPU work of a step, DECODE_STEP_CPU_S) and what each sequence in flight adds (its part of the
    roofline and its own CPU work, DECODE_TOKEN_CPU_S)."""
    weights_s = decode_step(0, ctx, plan, cfg)[2]
    t_step = decode_step(c, ctx, plan, cfg)[2]
    per_seq = (t_step - c * DECODE_OVERHEAD_S_PER_TOKEN - weights_s) / c + DECODE_TOKEN_CPU_S
    return weights_s + DECODE_STEP_CPU_S, per_seq


def generation(plan: Plan, cfg: RunConfig, kv_tokens: int, max_conc: int, prompt: float,
               resp: float, shaped: int = 0, share: float | None = None) -> Generation:
    """Decode rate of one engine and generation time of a batch on the busiest engine; with RL-shaped lengths
    (shaped: their mean before the cap), until its longest response ends, or with partial rollouts (share: the
    algo.partial_rollouts to predict for, the config's when None) until the groups it trains are done
    (plan.lengths)."""
    share = cfg.algo.partial_rollouts if share is None else share
    b, gpu, params = plan.batch, cfg.hardware.gpu, plan.model.params
    tp = plan.engines[0].tensor_parallel_size
    # engines sharing a GPU (engine.engines_per_gpu) are drawn as one engine with the GPU's whole engine share:
    # the roofline is the GPU's, and what parallel engine cores save in CPU work per step is not modelled
    n = len({gpu_group(e) for e in plan.engines})
    seqs_engine = math.ceil(b.prompts_per_step / n) * b.samples_per_prompt  # groups are dealt round-robin
    c = min(max_conc, seqs_engine)
    ctx = prompt + resp / 2
    t_mem, t_cmp, t_step = decode_step(c, ctx, plan, cfg)
    if shaped > 0:
        fixed, per_seq = decode_split(c, ctx, plan, cfg)
        decode_s = shaped_decode_s(fixed, per_seq, seqs_engine, resp, shaped, b.max_new_tokens, c,
                                   b.samples_per_prompt, share)
    else:
        full, rest = divmod(seqs_engine, c)
        decode_s = resp * (full * t_step + (decode_step(rest, ctx, plan, cfg)[2] if rest else 0.0))
    prefill_s = seqs_engine * prompt * 2 * params / tp / (gpu.bf16_tflops * 1e12 * MATMUL_EFFICIENCY)
    return Generation(
        num_engines=n,
        shared=len(plan.engines) > n,
        prompt=prompt,
        resp=resp,
        kv_tokens=kv_tokens,
        max_conc=max_conc,
        seqs_engine=seqs_engine,
        concurrency=c,
        t_mem=t_mem,
        t_cmp=t_cmp,
        t_step=t_step,
        gen_s=decode_s + prefill_s,
        batch_tokens=b.sequences_per_step * resp,
    )


TAIL_SHAPE_RATIO = 2.0  # a batch's longest response this many times the mean response: its lengths have a tail


@dataclass(frozen=True)
class TailCases:
    """A batch of RL-shaped lengths (task.response_length_mean) generated without and with partial rollouts.

    Without them the batch decodes until its longest response ends (about mean x (ln n + 0.58) steps for n
    sequences an engine, at most algo.max_new_tokens); with algo.partial_rollouts=share, until 1 / (1 + share) of
    its groups are done (plan.lengths.awaited_response). Either way it decodes all its tokens, each at its cost in a
    decode step, so what carrying saves is the decode steps of the tail, each a read of the weights and the engine's
    fixed CPU work of a step (DECODE_STEP_CPU_S, which is what a step of few sequences mostly costs). Where the batch
    needs more decode steps for its tokens at full concurrency than its longest response takes, nothing waits on
    the tail, and the two cases are the same. How much of the tail the next batch, launched ahead, fills is not
    modelled: the run measures it (gen/tail_filled), and its balance verdict reads it."""

    share: float  # algo.partial_rollouts of the case with them: the config's, or the share the balance advice names
    tail: bool  # the longest response is at least TAIL_SHAPE_RATIO times the mean
    mean_tokens: float  # the mean response
    longest_tokens: float  # the decode steps a batch waits for without partial rollouts: its longest response
    awaited_tokens: float  # with them
    without: Generation
    with_partial: Generation


def tail_cases(plan: Plan, cfg: RunConfig, kv_tokens: int, max_conc: int, prompt: float, resp: float, shaped: int,
               default_share: float) -> TailCases | None:
    """The batch generated without and with partial rollouts (at the config's share, else default_share); None
    without a length model (shaped 0: every response is taken to run to algo.max_new_tokens)."""
    if shaped <= 0:
        return None
    share = cfg.algo.partial_rollouts or default_share
    without = generation(plan, cfg, kv_tokens, max_conc, prompt, resp, shaped, 0.0)
    with_partial = generation(plan, cfg, kv_tokens, max_conc, prompt, resp, shaped, share)
    cap, n, group = plan.batch.max_new_tokens, without.seqs_engine, plan.batch.samples_per_prompt
    longest = longest_response(shaped, n, cap)
    return TailCases(share=share, tail=longest >= TAIL_SHAPE_RATIO * resp, mean_tokens=resp, longest_tokens=longest,
                     awaited_tokens=awaited_response(shaped, n, cap, group, share), without=without,
                     with_partial=with_partial)


__all__ = [
    "BF16_BYTES", "CALIBRATED_ON", "CALIBRATION_TOKENS_PER_S", "DECODE_OVERHEAD_S_PER_TOKEN", "DECODE_STEP_CPU_S",
    "DECODE_TOKEN_CPU_S", "HBM_EFFICIENCY", "MATMUL_EFFICIENCY", "TAIL_SHAPE_RATIO", "Generation", "TailCases",
    "decode_split", "decode_step", "engine_capacity", "generation", "step_time", "tail_cases",
]
