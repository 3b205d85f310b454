"""Plan + RunConfig -> predicted step times and balance, before any GPU is touched.

A roofline model: an engine's decode step is bound by memory bandwidth or by matmul rate, plus a per-sequence
overhead; a batch generates in waves of the sequences that fit at once; the learner's step is 6 x params x
tokens at an assumed MFU; a weight sync is the bf16 weights over the transport's bandwidth. Lengths are taken
at their maxima unless the caller gives means or task.response_length_mean their RL shape (plan.lengths). docs/plan.md
has the formulas. Every efficiency factor below says where it comes from. Pure Python: no torch, no Ray, no GPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from rlgen.config import RunConfig
from rlgen.config.cards import card
from rlgen.metrics.balance import BalanceContext, StepBalance, Verdict, assess, context_from_plan
from rlgen.plan import ENGINE_HEADROOM_GIB, GIB, Plan, Transport
from rlgen.plan.lengths import shaped_decode_s, shaped_mean
from rlgen.plan.placement import gpu_group

BF16_BYTES = 2

# What a program gets of the spec figures in hardware.gpu (peak bf16 TFLOP/s, HBM TB/s).
# bf16 8192^3 torch matmul on random data: 798 TFLOP/s on an H100 SXM, 769-798 on an H200 (torch 2.11+cu130);
# 771 on the H100 in the learner measurement below. 790 / 989 spec = 0.80.
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

# Learner: rlgen's DeepSpeed learner (ZeRO-2, bf16) on one H100, 128 rows of 312 tokens a step, 6 x params x
# tokens (benchmarks/learner_speed.py; docs/benchmarks.md, "Learner micro-batches"). At 32 rows a micro-batch the
# 1.5B reached 0.21 of the 989 TFLOP/s spec with gradient checkpointing, 0.25 without. At 8 rows each micro-batch
# took 0.36 s whatever its size (0.22 s without checkpointing): CPU work that grows with the layers. The 0.5B point
# is the 1.5B one scaled as a bare optimizer step scaled (22% against 36%); log(hidden size) in between.
LEARNER_MFU_POINTS = ((896, 0.13), (1536, 0.21))
NO_CHECKPOINTING_SPEEDUP = 1.19  # 0.25 / 0.21 at 32 rows, 1.5B
MICRO_FLOOR_S_PER_LAYER = {True: 0.0127, False: 0.0079}  # by gradient checkpointing: 0.356 s and 0.22 s / 28

# Weight sync over NCCL: broadcast of the 289 bf16 tensors of a 0.5B model (0.99 GB) from one H200 to
# another over NVLink (NV18), one call per tensor: 107 GB/s (367 GB/s as one flat buffer). NCCL 2.28.9.
# Measured within one host; across nodes expect less.
SYNC_NCCL_GBPS = 107.0

NO_CPU_ROOFLINE = (
    "no roofline for CPU: the hf engine and the torch learner on CPU are bound by per-token Python and kernel "
    "overheads that no bandwidth or FLOP figure predicts. Run `rlgen train steps=5` and read the measured "
    "verdict instead."
)


def _step_time(c: float, ctx: float, params: float, layers: int, hidden: int, kv_bytes: float, tp: int,
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
    _, _, t = _step_time(s["concurrency"], ctx, s["params"], s["layers"], s["hidden"], s["kv_bytes_per_token"], 1,
                         s["hbm_tbps"], s["bf16_tflops"])
    return 1.0 / CALIBRATION_TOKENS_PER_S - t / s["concurrency"]


DECODE_OVERHEAD_S_PER_TOKEN = _calibrated_overhead()  # about 49 us
CALIBRATED_ON = "vllm"  # the engine kind the decode overhead was measured on; others get a note


def _count(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def learner_mfu(hidden: int) -> float:
    (h0, m0), (h1, m1) = LEARNER_MFU_POINTS
    if hidden <= h0:
        return m0
    if hidden >= h1:
        return m1
    x = (math.log(hidden) - math.log(h0)) / (math.log(h1) - math.log(h0))
    return m0 + x * (m1 - m0)


@dataclass(frozen=True)
class Prediction:
    available: bool
    reason: str = ""  # why not, when not available
    num_engines: int = 0
    tensor_parallel_size: int = 1
    prompt_tokens: float = 0.0
    response_tokens: float = 0.0
    weights_gib_per_gpu: float = 0.0
    kv_capacity_tokens: int = 0  # per engine
    max_concurrency: int = 0  # per engine: min(max_num_seqs, KV capacity / tokens per sequence)
    concurrency: int = 0  # per engine, for this batch
    decode_step_s: float = 0.0
    decode_bound: str = ""  # "memory" | "compute": which roofline term is larger
    roofline_tokens_per_s: float = 0.0  # per engine, no overhead
    engine_tokens_per_s: float = 0.0  # per engine, calibrated
    gen_s: float = 0.0  # a batch, busiest engine
    gen_tokens_per_s: float = 0.0  # all engines
    learner_gpus: int = 0
    learner_mfu: float = 0.0
    train_tokens: int = 0
    train_s: float = 0.0
    sync_s: float = 0.0
    step_s: float = 0.0
    required_tokens_per_s: float = 0.0
    verdict: Verdict | None = None
    notes: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verdict"] = self.verdict.to_dict() if self.verdict else None
        return d


def predict(
    plan: Plan,
    mean_response_tokens: float | None = None,
    mean_prompt_tokens: float | None = None,
) -> Prediction:
    """Predicted step times and balance of a plan. On CPU, or without GPU figures, ``available`` is False."""
    if plan.device != "cuda":
        return Prediction(False, NO_CPU_ROOFLINE)
    cfg = plan.config  # the values the config left null, as the plan resolved them
    if not plan.engine.memory_share:
        return Prediction(False, f"engine={plan.engine_kind} takes no share of its GPU's memory, so its KV cache "
                                 "and decode rate have no roofline model here.")
    gpu = cfg.hardware.gpu
    if gpu.hbm_tbps <= 0 or gpu.bf16_tflops <= 0 or gpu.memory_gb <= 0:
        return Prediction(False, f"hardware={plan.hardware} gives no GPU figures (hardware.gpu: memory_gb, "
                                 "hbm_tbps, bf16_tflops), so there is no roofline to draw.")
    if not plan.engines or not plan.learners:
        return Prediction(False, "the plan places no engines or no learners.")
    b = plan.batch
    prompt = float(mean_prompt_tokens if mean_prompt_tokens is not None else b.max_prompt_tokens)
    shaped = cfg.task.response_length_mean
    if mean_response_tokens is None and shaped > 0:  # geometric lengths cut at the cap (task.response_length_mean)
        mean_response_tokens = shaped_mean(shaped, b.max_new_tokens)
    resp = float(mean_response_tokens if mean_response_tokens is not None else b.max_new_tokens)
    kv_tokens, max_conc = _engine_capacity(plan, cfg)
    if max_conc < 1:
        return Prediction(False, f"the KV cache of one engine holds {kv_tokens} tokens, less than one "
                                 f"{b.max_seq_len}-token sequence.")
    gen = _generation(plan, cfg, kv_tokens, max_conc, prompt, resp, shaped)
    learner = _learner(plan, cfg, prompt, resp)
    sync = _weight_sync(plan, cfg)
    return _prediction(plan, cfg, gen, learner, sync)


@dataclass(frozen=True)
class _Generation:
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


@dataclass(frozen=True)
class _Learner:
    """The learners' side of a step."""

    gpus: int
    mfu: float
    train_tokens: int
    mult: int  # FLOPs per param and token: 6, or 8 with a reference model
    train_s: float
    micros: int = 1  # micro-batches per rank
    floor_s: float = 0.0  # the least a micro-batch takes (CPU work)
    bound: str = "compute"  # what sets each micro-batch's time: "compute" or "launch floor"


@dataclass(frozen=True)
class _Sync:
    """The weight sync of a step and where its figure comes from."""

    sync_s: float
    source: str


@dataclass(frozen=True)
class _Balance:
    """The predicted step: its length, what the learner needs, the verdict."""

    step_s: float
    required_tokens_per_s: float
    verdict: Verdict
    shares_gpus: bool  # colocated with async_steps > 0: generation and training time-slice each GPU


def _engine_capacity(plan: Plan, cfg: RunConfig) -> tuple[int, int]:
    """KV capacity of one engine (all its GPUs) in tokens, and how many sequences fit at full length."""
    gpu, e, b = cfg.hardware.gpu, cfg.engine, plan.batch
    tp = plan.engines[0].tensor_parallel_size
    share = gpu.memory_gb * 1e9 * e.gpu_memory_utilization - ENGINE_HEADROOM_GIB * GIB  # less the weights below
    usable = tp * e.kv_cache_gib * GIB if e.kv_cache_gib else tp * share - plan.model.params * BF16_BYTES
    kv_tokens = max(0, int(usable // plan.model.kv_bytes_per_token))
    max_conc = min(e.max_num_seqs, kv_tokens // max(b.max_seq_len, 1))
    return kv_tokens, max_conc


def _decode_step(k: int, ctx: float, plan: Plan, cfg: RunConfig) -> tuple[float, float, float]:
    """(memory-bound s, compute-bound s) of one engine's decode step of k sequences, and its time with the
    per-token engine overhead."""
    m, gpu = cfg.model, cfg.hardware.gpu
    t_mem, t_cmp, t = _step_time(k, ctx, plan.model.params, m.num_layers, m.hidden_size,
                                 plan.model.kv_bytes_per_token, plan.engines[0].tensor_parallel_size,
                                 gpu.hbm_tbps, gpu.bf16_tflops)
    return t_mem, t_cmp, t + k * DECODE_OVERHEAD_S_PER_TOKEN


def _generation(plan: Plan, cfg: RunConfig, kv_tokens: int, max_conc: int, prompt: float,
                resp: float, shaped: int = 0) -> _Generation:
    """Decode rate of one engine and generation time of a batch on the busiest engine; with RL-shaped lengths
    (shaped: their mean before the cap), until its longest response ends (plan.lengths)."""
    b, gpu, params = plan.batch, cfg.hardware.gpu, plan.model.params
    tp = plan.engines[0].tensor_parallel_size
    # engines sharing a GPU (engine.engines_per_gpu) are drawn as one engine with the GPU's whole engine share:
    # the roofline is the GPU's, and what parallel engine cores save in CPU work per step is not modelled
    n = len({gpu_group(e) for e in plan.engines})
    seqs_engine = math.ceil(b.prompts_per_step / n) * b.samples_per_prompt  # groups are dealt round-robin
    c = min(max_conc, seqs_engine)
    ctx = prompt + resp / 2
    t_mem, t_cmp, t_step = _decode_step(c, ctx, plan, cfg)
    if shaped > 0:
        weights_s = _decode_step(0, ctx, plan, cfg)[2]  # a step's fixed part: the weights read once
        decode_s = shaped_decode_s(weights_s, (t_step - weights_s) / c, seqs_engine, resp, shaped, b.max_new_tokens, c,
                                   b.samples_per_prompt, cfg.algo.partial_rollouts)
    else:
        full, rest = divmod(seqs_engine, c)
        decode_s = resp * (full * t_step + (_decode_step(rest, ctx, plan, cfg)[2] if rest else 0.0))
    prefill_s = seqs_engine * prompt * 2 * params / tp / (gpu.bf16_tflops * 1e12 * MATMUL_EFFICIENCY)
    return _Generation(
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


def _learner(plan: Plan, cfg: RunConfig, prompt: float, resp: float) -> _Learner:
    """Training time of a batch over the learner GPUs: each rank's share of the packed tokens in micro-batches of
    algo.micro_batch_tokens, each the longer of its compute and the per-micro-batch floor."""
    gpus = len(plan.learners)
    ckpt = cfg.learner.gradient_checkpointing is not False
    mfu = learner_mfu(cfg.model.hidden_size) * (1.0 if ckpt else NO_CHECKPOINTING_SPEEDUP)
    train_tokens = int(plan.batch.sequences_per_step * (prompt + resp))
    mult = 8 if cfg.algo.kl_coef > 0 else 6
    rank_tokens = train_tokens / max(gpus, 1)
    budget = cfg.algo.micro_batch_tokens or rank_tokens
    micros = max(1, math.ceil(rank_tokens / max(budget, 1)))
    compute = mult * plan.model.params * rank_tokens / micros / (cfg.hardware.gpu.bf16_tflops * 1e12 * mfu)
    floor = cfg.model.num_layers * MICRO_FLOOR_S_PER_LAYER[ckpt]
    train_s = micros * max(compute, floor)
    return _Learner(gpus=gpus, mfu=mfu, train_tokens=train_tokens, mult=mult, train_s=train_s, micros=micros,
                    floor_s=floor, bound="launch floor" if floor > compute else "compute")


def _weight_sync(plan: Plan, cfg: RunConfig) -> _Sync:
    """Time to send the bf16 weights from the learners to the engines over the plan's transport."""
    weights = plan.model.params * BF16_BYTES
    if plan.transport == Transport.nccl:
        return _Sync(weights / (SYNC_NCCL_GBPS * 1e9),
                     f"bf16 weights / {SYNC_NCCL_GBPS:g} GB/s NCCL broadcast (measured, H200 NVLink)")
    if plan.transport == Transport.cuda_ipc:
        return _Sync(weights / (cfg.hardware.gpu.hbm_tbps * 1e12 * HBM_EFFICIENCY),
                     "one on-GPU copy of the bf16 weights; sleep/wake of the engine not included")
    return _Sync(0.0, "not modelled for this transport")


def _balance(plan: Plan, gen: _Generation, learner: _Learner, sync: _Sync) -> _Balance:
    """The step in steady state and its verdict.

    P = engines' time per batch, C = learner's. Overlapped (async_steps > 0, separate GPUs): the step is the
    longer of the two; otherwise the two run one after the other, the sync once. Colocated with async_steps > 0
    the engines generate the next batch on the GPUs the learner trains on, and the GPUs time-slice between them:
    the step is their sum. At 1.5B with 1024-token responses the overlapped step took 46.4 s on one H100 against
    47.7 s for generating (24.3 s) and training (23.4 s) one after the other, and 14.0 s on four against 12.9 s
    (docs/benchmarks.md, "Every GPU busy, continued").
    """
    gen_s, train_s, sync_s = gen.gen_s, learner.train_s, sync.sync_s
    producer, consumer = gen_s + sync_s, train_s + sync_s
    ctx_b: BalanceContext = context_from_plan(plan)
    if ctx_b.async_steps > 0:
        window = gen_s + train_s + sync_s if ctx_b.colocated else max(producer, consumer)
        wait, idle = max(0.0, producer - consumer), max(0.0, consumer - producer)
    else:
        window = gen_s + train_s + sync_s
        wait, idle = gen_s, train_s
    sb = StepBalance(step=-1, window_s=window, learner_wait_s=wait, producer_s=producer, consumer_s=consumer,
                     gen_s=gen_s, engine_idle_s=idle, sync_s=sync_s, tokens=gen.batch_tokens,
                     num_engines=gen.num_engines)
    return _Balance(
        step_s=window,
        required_tokens_per_s=gen.batch_tokens / consumer if consumer > 0 else 0.0,
        verdict=assess(sb, ctx_b),
        shares_gpus=ctx_b.async_steps > 0 and ctx_b.colocated,
    )


def _notes(plan: Plan, cfg: RunConfig, gen: _Generation, bal: _Balance) -> tuple[str, ...]:
    """What the prediction leaves out or guesses at, for this plan."""
    notes: list[str] = []
    if plan.transport == Transport.nccl and plan.nodes > 1:
        notes.append("engines on other nodes than learner rank 0 receive weights over the network; sync is "
                     "likely slower than predicted.")
    if gen.shared:
        notes.append(f"{len(plan.engines)} engines share {gen.num_engines} GPU(s): drawn as one engine per GPU, "
                     "so the gain from several engine cores' CPU work in parallel is not in the prediction.")
    if plan.engine_kind != CALIBRATED_ON:
        notes.append(f"decode overhead is calibrated on vLLM; engine={plan.engine_kind} is likely slower.")
    if cfg.model.hidden_size < LEARNER_MFU_POINTS[0][0]:
        notes.append("model is smaller than any measured learner shape; its learner time is a guess.")
    if bal.shares_gpus:
        notes.append("colocated with async_steps > 0: generation and training share each GPU and take turns on "
                     "it, so the step is predicted as their sum (as measured on one and four H100s).")
    return tuple(notes)


def _sources(plan: Plan, cfg: RunConfig, gen: _Generation, learner: _Learner, sync: _Sync) -> dict[str, str]:
    """Where each predicted number comes from, by Prediction field."""
    gpu, e, b = cfg.hardware.gpu, cfg.engine, plan.batch
    tp = plan.engines[0].tensor_parallel_size
    hbm_src = f"{gpu.hbm_tbps:g} TB/s spec x {HBM_EFFICIENCY} measured copy efficiency"
    return {
        "weights_gib_per_gpu": f"{_count(plan.model.params)} params x 2 bytes / TP {tp}",
        "kv_capacity_tokens": (f"engine.kv_cache_gib {e.kv_cache_gib} x TP" if e.kv_cache_gib else
                               f"({gpu.memory_gb:g} GB x gpu_memory_utilization {e.gpu_memory_utilization} - "
                               f"{ENGINE_HEADROOM_GIB:g} GiB headroom) x TP - weights")
        + f", / {plan.model.kv_bytes_per_token} KV bytes a token",
        "max_concurrency": f"min(engine.max_num_seqs={e.max_num_seqs}, KV tokens / {b.max_seq_len}-token sequences)",
        "decode_step_s": f"roofline ({hbm_src}; {gpu.bf16_tflops:g} TFLOP/s x {MATMUL_EFFICIENCY} measured matmul) "
                         f"+ {DECODE_OVERHEAD_S_PER_TOKEN * 1e6:.0f} us a token (calibrated: vLLM 0.5B on H100, "
                         f"{CALIBRATION_TOKENS_PER_S / 1e3:.1f}k tok/s)",
        "gen_s": f"{math.ceil(gen.seqs_engine / gen.concurrency)} wave(s) of <= {gen.concurrency} sequences x "
                 f"{gen.resp:g} tokens, + prefill",
        "train_s": f"{learner.micros} micro-batch(es) a rank, each the longer of {learner.mult} x params x its tokens / "
                   f"({gpu.bf16_tflops:g} TFLOP/s x MFU {learner.mfu:.2f}) and a {learner.floor_s:.2f} s launch floor "
                   f"({learner.bound}-bound; rlgen's DeepSpeed learner measured on H100)",
        "sync_s": sync.source,
    }


def _prediction(plan: Plan, cfg: RunConfig, gen: _Generation, learner: _Learner, sync: _Sync) -> Prediction:
    """The Prediction of a plan from the estimates of its two sides and its weight sync."""
    bal = _balance(plan, gen, learner, sync)
    tp = plan.engines[0].tensor_parallel_size
    return Prediction(
        available=True,
        num_engines=gen.num_engines,
        tensor_parallel_size=tp,
        prompt_tokens=gen.prompt,
        response_tokens=gen.resp,
        weights_gib_per_gpu=plan.model.params * BF16_BYTES / tp / GIB,
        kv_capacity_tokens=gen.kv_tokens,
        max_concurrency=gen.max_conc,
        concurrency=gen.concurrency,
        decode_step_s=gen.t_step,
        decode_bound="memory" if gen.t_mem >= gen.t_cmp else "compute",
        roofline_tokens_per_s=gen.concurrency / max(gen.t_mem, gen.t_cmp),
        engine_tokens_per_s=gen.concurrency / gen.t_step,
        gen_s=gen.gen_s,
        gen_tokens_per_s=gen.batch_tokens / gen.gen_s if gen.gen_s > 0 else 0.0,
        learner_gpus=learner.gpus,
        learner_mfu=learner.mfu,
        train_tokens=learner.train_tokens,
        train_s=learner.train_s,
        sync_s=sync.sync_s,
        step_s=bal.step_s,
        required_tokens_per_s=bal.required_tokens_per_s,
        verdict=bal.verdict,
        notes=_notes(plan, cfg, gen, bal),
        sources=_sources(plan, cfg, gen, learner, sync),
    )


def print_prediction(pred: Prediction, console=None) -> None:
    """The prediction as a rich table, one row per number with where it comes from."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(soft_wrap=True)
    if not pred.available:
        console.print(f"[bold]predicted balance:[/] {escape(pred.reason)}", highlight=False)
        return
    s = pred.sources
    t = Table(title="predicted balance (roofline, per step)", title_justify="left")
    for col in ("quantity", "value", "from"):
        t.add_column(col)
    rows = [
        ("weights per GPU", f"{pred.weights_gib_per_gpu:.2f} GiB", s["weights_gib_per_gpu"]),
        ("KV capacity per engine", f"{pred.kv_capacity_tokens:,} tokens", s["kv_capacity_tokens"]),
        ("max concurrency per engine", f"{pred.max_concurrency} sequences", s["max_concurrency"]),
        ("decode step", f"{pred.decode_step_s * 1e3:.2f} ms at {pred.concurrency} sequences "
                        f"({pred.decode_bound}-bound roofline)", s["decode_step_s"]),
        ("decode per engine", f"{pred.engine_tokens_per_s:,.0f} tok/s (roofline {pred.roofline_tokens_per_s:,.0f})",
         "concurrency / decode step"),
        ("generation", f"{pred.gen_s:.2f} s, {pred.gen_tokens_per_s:,.0f} tok/s over {pred.num_engines} engine(s)",
         s["gen_s"]),
        ("training", f"{pred.train_s:.2f} s, needs {pred.required_tokens_per_s:,.0f} tok/s", s["train_s"]),
        ("weight sync", f"{pred.sync_s:.3f} s", s["sync_s"]),
        ("step", f"{pred.step_s:.2f} s", "overlapped if async_steps > 0 on GPUs of their own, else summed"),
    ]
    for row in rows:
        t.add_row(*(escape(x) for x in row))
    console.print(t)
    console.print(f"assumes {pred.prompt_tokens:g}-token prompts and {pred.response_tokens:g}-token responses",
                  highlight=False)
    if pred.verdict is not None:
        console.print(f"[bold]predicted:[/] {escape(pred.verdict.advice)}", highlight=False)
    for note in pred.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
