"""StepTimeline -> which side of the loop is the bottleneck, by how much, and what to change.

The engines produce a batch (generate, load weights: P seconds) and the learner consumes it (score, train,
export: C seconds). With ratio = P / C, above 1 + band the step is generation-bound, below 1 / (1 + band)
training-bound, and balanced in between. ``BalanceTracker`` changes its verdict only after the new kind has
held for ``hold`` steps in a row. How P and C are read from a step's spans: docs/plan.md. Verdicts over several
steps are their means (a median lands on either step of a series that alternates), with the spread of the step times
beside (rlgen.metrics.steady). Whether carrying the generation tail would pay: rlgen.metrics.tail_gain.
Pure Python: no torch, no Ray.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from rlgen.metrics.balance_context import NO_CONTEXT, BalanceContext
from rlgen.metrics.room_advice import more_engines, with_more_gpus
from rlgen.metrics.steady import steady, uneven_clause
from rlgen.metrics.tail_gain import carry_advice, carry_gain, tail_wait_s
from rlgen.types import covered_seconds

DEFAULT_BAND = 0.15  # ratio within [1/1.15, 1.15]: balanced
DEFAULT_HOLD = 3  # consecutive steps a new kind must hold before the rolling verdict changes
DEFAULT_WINDOW = 5  # steps the rolling numbers average over
DEFAULT_WARMUP = 1  # first steps left out of rolling and run verdicts (first generate/backward are slow)
SYNC_NOTE_FRAC = 0.2  # mention weight sync when it takes more than this share of the step
TEACHER_NOTE_FRAC = 0.3  # name a distillation teacher's scoring when it takes this share of the learners' time


class Kind(StrEnum):
    generation_bound = "generation_bound"
    training_bound = "training_bound"
    balanced = "balanced"


@dataclass(frozen=True)
class StepBalance:
    """The measured (or predicted) times of one step, in seconds; tokens are the batch's response tokens."""

    step: int
    window_s: float
    learner_wait_s: float
    producer_s: float  # busiest engine: generate + sync
    consumer_s: float  # window - learner wait
    gen_s: float  # busiest engine: generate only
    engine_idle_s: float  # mean over engines
    sync_s: float  # the weight update's wall time: learner export and engine loads, overlaps counted once
    tokens: int
    num_engines: int
    env_s: float = 0.0  # busiest engine: waiting for its episodes' environment calls (multi-turn tasks)
    tail_s: float = 0.0  # the longest engine's generation tail (gen/tail_s: after 90% of its requests were done)
    tail_filled: float | None = None  # gen/tail_filled: the share of the tail the next batch generated beside
    # the learner's wait for the tail that nothing filled: what carrying it would save (rlgen.metrics.tail_gain).
    # None: not measured
    tail_wait_s: float | None = None
    teacher_s: float = 0.0  # the busiest learner rank's teacher scoring (on-policy distillation): consumer time

    @property
    def ratio(self) -> float:
        """P / C; inf when the learner took no time at all."""
        if self.consumer_s <= 0:
            return math.inf if self.producer_s > 0 else 1.0
        return self.producer_s / self.consumer_s


ENV_BOUND_FRAC = 0.3  # an environment taking this share of the engines' busy time is named as the bottleneck


def _span(s: Any) -> tuple[str, str, float, float]:
    if isinstance(s, Mapping):
        return str(s["actor"]), str(s["phase"]), float(s["start"]), float(s["end"])
    phase = getattr(s.phase, "value", s.phase)
    return str(s.actor), str(phase), float(s.start), float(s.end)


def _per_actor_max(rows: list[tuple[str, str, float, float]], prefix: str, phase: str) -> float:
    per: dict[str, float] = {}
    for actor, p, a, b in rows:
        if actor.startswith(prefix) and p == phase:
            per[actor] = per.get(actor, 0.0) + b - a
    return max(per.values(), default=0.0)


def measure(spans: Iterable[Any], tokens: int, step: int = 0, num_engines: int | None = None) -> StepBalance:
    """One step's StepBalance from its spans (Span objects or {actor, phase, start, end} dicts)."""
    rows = [_span(s) for s in spans]
    loop = [r for r in rows if not r[0].startswith("engine")]
    if not loop:
        raise ValueError(f"step {step}: the timeline has no learner or driver spans, so it has no step window")
    window = max(r[3] for r in loop) - min(r[2] for r in loop)
    wait = _per_actor_max(rows, "learner", "wait")  # learner ranks wait side by side: count it once
    busy: dict[str, float] = {}
    gen: dict[str, float] = {}
    env: dict[str, float] = {}
    for actor, phase, a, b in rows:
        if not actor.startswith("engine"):
            continue
        busy.setdefault(actor, 0.0)
        if phase in ("generate", "sync", "env"):  # an engine's episodes waiting for their environment: still its work
            busy[actor] += b - a
        if phase == "env":
            env[actor] = env.get(actor, 0.0) + b - a
        if phase == "generate":
            gen[actor] = gen.get(actor, 0.0) + b - a
    n = max(num_engines or 0, len(busy), 1)
    # An engine with no span in the step (no requests this time) was idle the whole window.
    idle = [max(0.0, window - v) for v in busy.values()] + [window] * (n - len(busy))
    return StepBalance(
        step=step,
        window_s=window,
        learner_wait_s=wait,
        producer_s=max(busy.values(), default=0.0),
        consumer_s=max(0.0, window - wait),
        gen_s=max(gen.values(), default=0.0),
        engine_idle_s=sum(idle) / len(idle),
        sync_s=covered_seconds((a, b) for _, p, a, b in rows if p == "sync"),
        tokens=int(tokens),
        num_engines=n,
        env_s=max(env.values(), default=0.0),
        teacher_s=_per_actor_max(rows, "learner", "teacher"),
    )


def measure_record(record: Mapping[str, Any], num_engines: int | None = None) -> StepBalance:
    """A StepBalance from one metrics record (its ``timeline``, ``response_tokens`` and generation tail: gen/tail_s
    and gen/tail_filled, which engines without a tail measurement leave out)."""
    m = measure(record["timeline"], int(record.get("response_tokens", 0)), int(record.get("step", 0)), num_engines)
    tail, filled = record.get("gen/tail_s"), record.get("gen/tail_filled")
    m = replace(m, tail_s=float(tail or 0.0))
    if tail is None or filled is None:
        return m
    wait = tail_wait_s(float(tail), m.learner_wait_s, float(filled))
    return m if wait is None else replace(m, tail_filled=float(filled), tail_wait_s=wait)


def classify(ratio: float, band: float = DEFAULT_BAND) -> Kind:
    if ratio > 1 + band:
        return Kind.generation_bound
    if ratio < 1 / (1 + band):
        return Kind.training_bound
    return Kind.balanced


@dataclass(frozen=True)
class Verdict:
    kind: str  # Kind value; in a rolling verdict, after hysteresis
    learner_wait_s: float
    engine_idle_s: float
    learner_wait_frac: float
    engine_idle_frac: float
    gen_tokens_per_s: float  # batch tokens / producer time
    required_tokens_per_s: float  # batch tokens / consumer time
    sync_s: float
    advice: str
    ratio: float = 1.0  # producer / consumer time
    step_kind: str = ""  # this step's own kind, before hysteresis
    step: int = -1  # the latest step the numbers include
    steps: int = 1  # steps the numbers average over
    step_s: float = 0.0  # step window
    producer_s: float = 0.0
    consumer_s: float = 0.0
    first_step: int = -1  # the first step the numbers include
    step_median_s: float = 0.0  # beside the mean step_s only
    step_min_s: float = 0.0
    step_max_s: float = 0.0
    spread: float = 1.0  # the longest step over the shortest (rlgen.metrics.steady)
    partial_gain: float | None = None  # share of the mean step carrying the tail would save (None: not measured)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = str(v)
        return d


def _fmt_x(r: float) -> str:
    return "inf" if not math.isfinite(r) else f"{r:.1f}x"


def advise(kind: Kind, m: StepBalance, ctx: BalanceContext = NO_CONTEXT) -> str:
    """One sentence: what the bottleneck is, how big, and what to change."""
    n = ctx.num_engines or m.num_engines
    window = max(m.window_s, 1e-12)
    ratio = m.ratio
    fixes: list[str] = []
    # advise async_steps=1 (colocated: the engine then stays awake and overlaps) only where the plan itself runs
    # engines ahead by default (plan.overlap.runs_ahead); CPU runs stay on-policy
    overlap = ctx.async_steps == 0 and ctx.runs_ahead
    if kind == Kind.generation_bound:
        head = (
            f"generation-bound: the learner waited {m.learner_wait_s / window:.0%} of the step; generating a batch "
            f"takes {_fmt_x(ratio)} as long as training on it"
        )
        more_gpus = more_engines(n, ratio, ctx, fixes)
        if ctx.tensor_parallel_size > 1:
            fixes.append(
                f"split engines to a smaller engine.tensor_parallel_size than {ctx.tensor_parallel_size} "
                "(data-parallel engines decode more tokens per GPU)"
            )
        if overlap:
            fixes.append("raise algo.async_steps to 1 so generation overlaps training")
        if m.env_s > ENV_BOUND_FRAC * m.producer_s:
            head += f", and {m.env_s / max(m.producer_s, 1e-12):.0%} of the engines' time is their environment's"
            fixes.insert(0, "make the environment answer faster or raise task.env_workers (the environment is the "
                            "bottleneck)")
        if ctx.episodes and ctx.async_steps == 1 and ctx.runs_ahead:
            fixes.append("raise algo.async_steps to 2 so the next batch's episodes generate while this one's last "
                         "wait on their environment")
        fixes.append("shorten responses (algo.max_new_tokens)")
    elif kind == Kind.training_bound:
        head = (
            f"training-bound: engines sat idle {m.engine_idle_s / window:.0%} of the step waiting for weights; "
            f"training on a batch takes {_fmt_x(1 / ratio if ratio > 0 else math.inf)} as long as generating it"
        )
        keep = max(1, math.ceil(n * ratio - 1e-9))
        if keep < n:
            spare = " and give their GPUs to learners" if ctx.device == "cuda" and not ctx.colocated else ""
            fixes.append(f"use fewer engines (engine.num_engines={keep} would keep up){spare}")
        if overlap:
            fixes.append("raise algo.async_steps to 1 so engines generate the next batch while the learner trains")
        if ctx.hybrid:
            fixes.insert(0, f"train on every GPU (hardware.colocated=true: a learner rank beside the engines on each "
                            f"of the {ctx.engine_gpus + ctx.learner_gpus} GPUs, not {ctx.learner_gpus})")
        if m.teacher_s > TEACHER_NOTE_FRAC * m.consumer_s:
            head += f", and the teacher's scoring takes {m.teacher_s / max(m.consumer_s, 1e-12):.0%} of the learners' time"
            fixes.append("score with a smaller teacher (algo.teacher)")
        fixes.append("speed up the learner (fewer micro-batches: a larger algo.micro_batch_tokens, as far as the "
                     "learner GPU's memory allows)")
        more_gpus = with_more_gpus(ctx, "more learner ranks")
    else:
        more_gpus = ""
        head = f"balanced: generating and training a batch take about the same time (ratio {ratio:.2f})"
        if overlap:
            saved = min(m.producer_s, m.consumer_s)
            fixes.append(f"raise algo.async_steps to 1 to overlap them (saves up to {saved:.3g} s a step)")
    # carrying the tail: where it is predicted to cut the mean step enough (rlgen.metrics.tail_gain); with partial
    # rollouts on, the measured tail is the cut one, and multi-turn episodes are not carried
    carry = None if ctx.partial or ctx.episodes else carry_advice(m.tail_wait_s, m.window_s)
    if carry:
        head += f"; {carry[0]}"
        fixes.insert(0, carry[1])
    text = head + ("; " + ", or ".join(fixes) if fixes else "") + (f"; {more_gpus}" if more_gpus else "")
    if m.sync_s > SYNC_NOTE_FRAC * window:
        text += f". Weight sync takes {m.sync_s / window:.0%} of the step"
    if ctx.colocated and ctx.async_steps == 0 and kind != Kind.balanced:
        text += ". Engines share the learners' GPUs here and sleep while they train, so the two sides run in turn"
    return text + "."


def assess(m: StepBalance, ctx: BalanceContext = NO_CONTEXT, band: float = DEFAULT_BAND) -> Verdict:
    """The verdict of one step (no hysteresis)."""
    kind = classify(m.ratio, band)
    return _verdict(kind, kind, [m], ctx)


def _verdict(kind: Kind, step_kind: Kind, ms: Sequence[StepBalance], ctx: BalanceContext,
             m: StepBalance | None = None, tail: int = 0) -> Verdict:
    """The verdict of the steps ms: the numbers of m (their mean, combine), the spread of their step times (less
    the last ``tail`` of them)."""
    m = m or (ms[0] if len(ms) == 1 else combine(ms))
    times = [x.window_s for x in ms]
    st = steady(times, warmup=0, tail=tail if len(times) - tail >= 2 else 0)
    window = max(m.window_s, 1e-12)
    return Verdict(
        kind=kind.value,
        learner_wait_s=m.learner_wait_s,
        engine_idle_s=m.engine_idle_s,
        learner_wait_frac=m.learner_wait_s / window,
        engine_idle_frac=m.engine_idle_s / window,
        gen_tokens_per_s=m.tokens / m.producer_s if m.producer_s > 0 else 0.0,
        required_tokens_per_s=m.tokens / m.consumer_s if m.consumer_s > 0 else 0.0,
        sync_s=m.sync_s,
        advice=advise(kind, m, ctx) + uneven_clause(st, times[: len(times) - tail] if st and st.steps < len(times) else times),
        ratio=m.ratio,
        step_kind=step_kind.value,
        step=m.step,
        steps=len(ms),
        step_s=m.window_s,
        producer_s=m.producer_s,
        consumer_s=m.consumer_s,
        first_step=ms[0].step,
        step_median_s=st.median_s if st else m.window_s,
        step_min_s=st.min_s if st else m.window_s,
        step_max_s=st.max_s if st else m.window_s,
        spread=st.spread if st else 1.0,
        partial_gain=carry_gain(m.tail_wait_s, m.window_s),
    )


def combine(ms: Sequence[StepBalance], how: str = "mean") -> StepBalance:
    """One StepBalance standing for several steps: their mean, or their median. A figure that some step lacks
    (None: its tail not measured) is None."""
    if not ms:
        raise ValueError("combine needs at least one step")
    avg = statistics.median if how == "median" else statistics.fmean

    def f(key: str) -> float:
        return float(avg([getattr(m, key) for m in ms]))

    def known(key: str) -> float | None:
        got = [getattr(m, key) for m in ms]
        return None if any(x is None for x in got) else float(avg(got))

    return StepBalance(
        step=ms[-1].step,
        window_s=f("window_s"),
        learner_wait_s=f("learner_wait_s"),
        producer_s=f("producer_s"),
        consumer_s=f("consumer_s"),
        gen_s=f("gen_s"),
        engine_idle_s=f("engine_idle_s"),
        sync_s=f("sync_s"),
        tokens=round(f("tokens")),
        num_engines=max(m.num_engines for m in ms),
        env_s=f("env_s"),
        tail_s=f("tail_s"),
        tail_filled=known("tail_filled"),
        tail_wait_s=known("tail_wait_s"),
        teacher_s=f("teacher_s"),
    )


class BalanceTracker:
    """Feeds on one step at a time and keeps a rolling verdict with hysteresis.

    ``update(record)`` returns the rolling Verdict: ``kind`` after hysteresis, ``step_kind`` the step's own,
    numbers averaged over the last ``window`` steps past warm-up.
    """

    def __init__(
        self,
        ctx: BalanceContext = NO_CONTEXT,
        hold: int = DEFAULT_HOLD,
        band: float = DEFAULT_BAND,
        window: int = DEFAULT_WINDOW,
        warmup: int = DEFAULT_WARMUP,
    ):
        if hold < 1 or window < 1 or band < 0 or warmup < 0:
            raise ValueError(f"need hold >= 1, window >= 1, band >= 0, warmup >= 0 (got {hold}, {window}, {band}, {warmup})")
        self.ctx, self.hold, self.band, self.warmup = ctx, hold, band, warmup
        self.recent: deque[StepBalance] = deque(maxlen=window)
        self.kind: Kind | None = None
        self._candidate: Kind | None = None
        self._count = 0
        self.seen = 0
        self.history: list[Verdict] = []

    def update(self, record: Mapping[str, Any] | StepBalance) -> Verdict:
        m = record if isinstance(record, StepBalance) else measure_record(record, self.ctx.num_engines)
        self.seen += 1
        raw = classify(m.ratio, self.band)
        if self.seen <= self.warmup:
            v = _verdict(raw, raw, [m], self.ctx)
            self.history.append(v)
            return v
        self.recent.append(m)
        self._step_kind(raw)
        assert self.kind is not None
        v = _verdict(self.kind, raw, list(self.recent), self.ctx)
        self.history.append(v)
        return v

    def _step_kind(self, raw: Kind) -> None:
        if self.kind is None or raw == self.kind:
            self.kind = raw
            self._candidate, self._count = None, 0
            return
        if raw == self._candidate:
            self._count += 1
        else:
            self._candidate, self._count = raw, 1
        if self._count >= self.hold:
            self.kind = raw
            self._candidate, self._count = None, 0

    @property
    def rolling(self) -> Verdict | None:
        return self.history[-1] if self.history else None


def summarize(
    records: Sequence[Mapping[str, Any]],
    ctx: BalanceContext = NO_CONTEXT,
    band: float = DEFAULT_BAND,
    warmup: int = DEFAULT_WARMUP,
) -> Verdict | None:
    """The run's verdict: means over every step past warm-up (all steps if the run is that short), with the
    spread of their step times (the last left out, of four or more); where they spread over
    steady.SPREAD_LIMIT, its advice says how (they alternate, or range from one time to another)."""
    ms = [measure_record(r, ctx.num_engines) for r in records if r.get("timeline")]
    if not ms:
        return None
    use = ms[warmup:] if len(ms) > warmup else ms
    m = combine(use)
    kind = classify(m.ratio, band)
    # the spread leaves the run's last step out: nothing generates beside it, so it is short by nature
    return _verdict(kind, kind, use, ctx, m, tail=1 if len(use) >= 4 else 0)
