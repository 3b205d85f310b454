"""Plan + RunConfig -> predicted step times and balance, before any GPU is touched.

A roofline model: an engine's decode step is bound by memory bandwidth or by matmul rate, plus a per-sequence
overhead; a batch generates in waves of the sequences that fit at once; the learner's step is 6 x params x
tokens at an assumed MFU; a weight sync is the bf16 weights over the transport's bandwidth. Lengths are taken
at their maxima unless the caller gives means or task.response_length_mean their RL shape (plan.lengths); with that
shape the batch's longest response sets its generation, and the step is predicted without and with partial rollouts
as well. The engines' side is rlgen.plan.prediction_generation. docs/plan.md has the formulas. Every efficiency
factor says where it comes from. Pure Python: no torch, no Ray, no GPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from rlgen.config import RunConfig
from rlgen.metrics.balance import BalanceContext, StepBalance, Verdict, assess
from rlgen.metrics.balance_context import context_from_plan
from rlgen.metrics.tail_gain import PARTIAL_GAIN_FRAC, PARTIAL_SHARE
from rlgen.plan import ENGINE_HEADROOM_GIB, GIB, Plan, Transport
from rlgen.plan.lengths import shaped_mean
from rlgen.plan.prediction_generation import (
    BF16_BYTES,
    CALIBRATED_ON,
    CALIBRATION_TOKENS_PER_S,
    DECODE_OVERHEAD_S_PER_TOKEN,
    HBM_EFFICIENCY,
    MATMUL_EFFICIENCY,
    Generation,
    TailCases,
    engine_capacity,
    generation,
    tail_cases,
)

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
class PartialPrediction:
    """The predicted step without and with partial rollouts, for RL-shaped lengths (prediction_generation.TailCases)."""

    share: float  # algo.partial_rollouts of the case with them: the config's, or the share the balance advice names
    tail: bool  # the batch's longest response is well above the mean (TAIL_SHAPE_RATIO)
    mean_tokens: float
    longest_tokens: float  # what a batch waits for without partial rollouts
    awaited_tokens: float  # with them
    gen_s_without: float
    gen_s_with: float
    step_s_without: float
    step_s_with: float
    gain: float  # 1 - step with / step without
    gen_gain: float  # 1 - generation with / without

    @property
    def faster(self) -> bool:
        """Whether the step with partial rollouts is predicted shorter by at least PARTIAL_GAIN_FRAC."""
        return self.gain >= PARTIAL_GAIN_FRAC


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
    teacher_s: float = 0.0  # of train_s: a distillation teacher's scoring
    sync_s: float = 0.0
    step_s: float = 0.0
    required_tokens_per_s: float = 0.0
    verdict: Verdict | None = None
    partial: PartialPrediction | None = None  # RL-shaped lengths only: the step without and with partial rollouts
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
    kv_tokens, max_conc = engine_capacity(plan, cfg)
    if max_conc < 1:
        return Prediction(False, f"the KV cache of one engine holds {kv_tokens} tokens, less than one "
                                 f"{b.max_seq_len}-token sequence.")
    gen = generation(plan, cfg, kv_tokens, max_conc, prompt, resp, shaped)
    learner = _learner(plan, cfg, prompt, resp)
    sync = _weight_sync(plan, cfg)
    cases = tail_cases(plan, cfg, kv_tokens, max_conc, prompt, resp, shaped, PARTIAL_SHARE)
    return _prediction(plan, cfg, gen, learner, sync, _partial(plan, cases, learner, sync))


def _partial(plan: Plan, cases: TailCases | None, learner: _Learner, sync: _Sync) -> PartialPrediction | None:
    """The step of each case, as the step of the plan is predicted (_balance)."""
    if cases is None:
        return None
    without = _balance(plan, cases.without, learner, sync).step_s
    with_partial = _balance(plan, cases.with_partial, learner, sync).step_s
    g0, g1 = cases.without.gen_s, cases.with_partial.gen_s
    return PartialPrediction(
        share=cases.share, tail=cases.tail, mean_tokens=cases.mean_tokens, longest_tokens=cases.longest_tokens,
        awaited_tokens=cases.awaited_tokens, gen_s_without=g0, gen_s_with=g1, step_s_without=without,
        step_s_with=with_partial, gain=1 - with_partial / without if without > 0 else 0.0,
        gen_gain=1 - g1 / g0 if g0 > 0 else 0.0)


@dataclass(frozen=True)
class _Learner:
    """The learners' side of a step."""

    gpus: int
    mfu: float
    train_tokens: int
    mult: int  # FLOPs per param and token: 6, or 8 with a reference model (a teacher adds 2 per its param)
    train_s: float
    micros: int = 1  # micro-batches per rank
    floor_s: float = 0.0  # the least a micro-batch takes (CPU work)
    bound: str = "compute"  # what sets each micro-batch's time: "compute" or "launch floor"
    teacher_s: float = 0.0  # of train_s, a distillation teacher's scoring (its share of the FLOPs)


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
    teacher = 2 * plan.teacher.params if plan.teacher else 0  # distillation: the teacher's no-grad forward
    compute = (mult * plan.model.params + teacher) * rank_tokens / micros / (cfg.hardware.gpu.bf16_tflops * 1e12 * mfu)
    floor = cfg.model.num_layers * MICRO_FLOOR_S_PER_LAYER[ckpt]
    train_s = micros * max(compute, floor)
    return _Learner(gpus=gpus, mfu=mfu, train_tokens=train_tokens, mult=mult, train_s=train_s, micros=micros,
                    floor_s=floor, bound="launch floor" if floor > compute else "compute",
                    teacher_s=train_s * teacher / (mult * plan.model.params + teacher))


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


def _balance(plan: Plan, gen: Generation, learner: _Learner, sync: _Sync) -> _Balance:
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
                     num_engines=gen.num_engines, teacher_s=learner.teacher_s)
    return _Balance(
        step_s=window,
        required_tokens_per_s=gen.batch_tokens / consumer if consumer > 0 else 0.0,
        verdict=assess(sb, ctx_b),
        shares_gpus=ctx_b.async_steps > 0 and ctx_b.colocated,
    )


def _notes(plan: Plan, cfg: RunConfig, gen: Generation, bal: _Balance,
           partial: PartialPrediction | None) -> tuple[str, ...]:
    """What the prediction leaves out or guesses at, for this plan."""
    notes: list[str] = []
    if partial is not None and cfg.algo.partial_rollouts > 0 and not partial.faster:
        notes.append(_no_gain_note(partial))
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


def _no_gain_note(p: PartialPrediction) -> str:
    """Partial rollouts on and predicted not to shorten the step: why."""
    if not p.tail:
        why = (f"a batch's longest response (about {p.longest_tokens:.0f} tokens) is not far above the mean "
               f"({p.mean_tokens:.0f}), so there is little tail to carry")
    elif p.gen_gain >= PARTIAL_GAIN_FRAC:
        why = "generating the batch gets shorter, but the step waits on training, not on the generation tail"
    else:
        why = ("the engines need more decode steps for the batch's tokens at full concurrency than its longest "
               "response takes, so nothing waits on the tail")
    return (f"algo.partial_rollouts={p.share:g} is predicted not to shorten the step here ({p.step_s_with:.2f} s with "
            f"it, {p.step_s_without:.2f} s without): {why}.")


def _partial_row(p: PartialPrediction) -> tuple[str, str, str]:
    """The table row of the step without and with partial rollouts, and which is predicted faster."""
    which = (f"faster with algo.partial_rollouts={p.share:g}, by about {p.gain:.0%}" if p.faster else
             f"about the same (under {PARTIAL_GAIN_FRAC:.0%} apart)")
    return ("step without / with partial rollouts", f"{p.step_s_without:.2f} s / {p.step_s_with:.2f} s: {which}",
            f"generation waits for the longest of each engine's responses (about {p.longest_tokens:.0f} tokens, mean "
            f"{p.mean_tokens:.0f}), with partial rollouts until 1 / (1 + {p.share:g}) of its groups are done (about "
            f"{p.awaited_tokens:.0f}); how much of the tail the next batch fills is not modelled (the run measures "
            "it: gen/tail_filled)")


def _sources(plan: Plan, cfg: RunConfig, gen: Generation, learner: _Learner, sync: _Sync) -> dict[str, str]:
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


def _prediction(plan: Plan, cfg: RunConfig, gen: Generation, learner: _Learner, sync: _Sync,
                partial: PartialPrediction | None = None) -> Prediction:
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
        teacher_s=learner.teacher_s,
        sync_s=sync.sync_s,
        step_s=bal.step_s,
        required_tokens_per_s=bal.required_tokens_per_s,
        verdict=bal.verdict,
        partial=partial,
        notes=_notes(plan, cfg, gen, bal, partial),
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
    if pred.partial is not None and pred.partial.tail:
        rows.append(_partial_row(pred.partial))
    for row in rows:
        t.add_row(*(escape(x) for x in row))
    console.print(t)
    console.print(f"assumes {pred.prompt_tokens:g}-token prompts and {pred.response_tokens:g}-token responses",
                  highlight=False)
    if pred.verdict is not None:
        console.print(f"[bold]predicted:[/] {escape(pred.verdict.advice)}", highlight=False)
    for note in pred.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
