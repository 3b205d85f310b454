"""A run's report: a timeline (Gantt) PNG of the last steps, throughput and reward plots, a terminal summary.

Input is the list of per-step records (``metrics.jsonl``): each has ``timeline`` spans
({actor, phase, start, end}), ``response_tokens``, ``step_s``, ``reward_mean``. Figures are drawn on the Agg
canvas directly, so nothing here touches pyplot's global state or needs a display.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlgen.metrics.balance import (
    DEFAULT_WARMUP,
    NO_CONTEXT,
    BalanceContext,
    Kind,
    Verdict,
    assess,
    measure_record,
    summarize,
)
from rlgen.metrics.balance_context import context_from_plan

PHASE_COLORS = {
    "generate": "#2ca02c",
    "sync": "#9467bd",
    "train": "#1f77b4",
    "wait": "#d62728",
    "reward": "#ff7f0e",
    "env": "#8c564b",
    "idle": "#bdbdbd",
}
KIND_SHADE = {Kind.generation_bound.value: "#f4cccc", Kind.training_bound.value: "#cfe2f3"}
KIND_LABEL = {
    Kind.generation_bound.value: "generation-bound",
    Kind.training_bound.value: "training-bound",
    Kind.balanced.value: "balanced",
}


def _num(x: Any, default: float = 0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def _new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _actor_order(actor: str) -> tuple[int, int, str]:
    for rank, prefix in enumerate(("engine", "learner", "driver")):
        if actor.startswith(prefix):
            tail = actor.removeprefix(prefix)
            return rank, int(tail) if tail.isdigit() else 0, actor
    return 3, 0, actor


def _gaps(busy: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The parts of [lo, hi] that no interval in busy covers."""
    out, t = [], lo
    for a, b in sorted(busy):
        if a > t:
            out.append((t, min(a, hi)))
        t = max(t, b)
        if t >= hi:
            break
    if t < hi:
        out.append((t, hi))
    return [(a, b) for a, b in out if b > a]


def plot_timeline(records: Sequence[Mapping[str, Any]], path: str | Path, last_n: int = 8,
                  ctx: BalanceContext = NO_CONTEXT) -> Path:
    """Gantt chart of the last ``last_n`` steps: one row per actor, one colour per phase.

    Engine time outside generate/sync inside the loop's windows is drawn hatched grey (idle, waiting for
    weights), so a training-bound run shows grey engine rows and a generation-bound run red learner rows.
    """
    from matplotlib.patches import Patch

    recs = [r for r in records if r.get("timeline")][-last_n:]
    if not recs:
        raise ValueError("no records with a timeline to draw")
    spans = [(str(s["actor"]), str(s["phase"]), _num(s["start"]), _num(s["end"])) for r in recs for s in r["timeline"]]
    t0 = min(s[2] for s in spans)
    actors = sorted({s[0] for s in spans}, key=_actor_order)
    row = {a: i for i, a in enumerate(reversed(actors))}
    fig = _new_figure(12, 1.6 + 0.55 * len(actors))
    ax = fig.add_subplot(1, 1, 1)
    height = 0.7
    for actor in actors:
        by_phase: dict[str, list[tuple[float, float]]] = {}
        for a, phase, s, e in spans:
            if a == actor and e > s:
                by_phase.setdefault(phase, []).append((s - t0, e - s))
        for phase, bars in by_phase.items():
            ax.broken_barh(bars, (row[actor] - height / 2, height), facecolors=PHASE_COLORS.get(phase, "#7f7f7f"))
    # Engine idle: gaps in each engine's busy time within each step's loop window.
    windows = []
    for r in recs:
        loop = [s for s in r["timeline"] if not str(s["actor"]).startswith("engine")]
        if loop:
            windows.append((min(_num(s["start"]) for s in loop) - t0, max(_num(s["end"]) for s in loop) - t0, r))
    for actor in actors:
        if not actor.startswith("engine"):
            continue
        busy = [(s - t0, e - t0) for a, p, s, e in spans if a == actor and p in ("generate", "sync")]
        gaps = [g for lo, hi, _ in windows for g in _gaps(busy, lo, hi)]
        ax.broken_barh([(a, b - a) for a, b in gaps], (row[actor] - height / 2, height),
                       facecolors="none", edgecolors=PHASE_COLORS["idle"], hatch="///", linewidth=0.0)
    for lo, _, r in windows:
        ax.axvline(lo, color="black", linewidth=0.6, linestyle=":")
        ax.text(lo, len(actors) - 0.45, f" step {r.get('step', '?')}", fontsize=7, va="bottom")
    ax.set_yticks(range(len(actors)))
    ax.set_yticklabels(list(reversed(actors)))
    ax.set_ylim(-0.6, len(actors) - 0.1)
    ax.set_xlabel("seconds")
    v = summarize(recs, ctx, warmup=0)
    title = f"last {len(recs)} steps"
    if v is not None:
        title += (f": {KIND_LABEL[v.kind]} (ratio {v.ratio:.2f}); learner waited {v.learner_wait_frac:.0%}, "
                  f"engines idle {v.engine_idle_frac:.0%} of the step")
    ax.set_title(title, fontsize=10)
    handles = [Patch(facecolor=c, label=p) for p, c in PHASE_COLORS.items() if p != "idle"]
    handles.append(Patch(facecolor="none", edgecolor=PHASE_COLORS["idle"], hatch="///", label="engine idle"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=len(handles), fontsize=8,
              frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def step_verdicts(records: Sequence[Mapping[str, Any]], ctx: BalanceContext = NO_CONTEXT) -> list[Verdict]:
    """Each step's own verdict (no hysteresis), for the records that have a timeline."""
    return [assess(measure_record(r, ctx.num_engines), ctx) for r in records if r.get("timeline")]


def plot_throughput(records: Sequence[Mapping[str, Any]], path: str | Path,
                    ctx: BalanceContext = NO_CONTEXT) -> Path:
    """Per step: generation throughput, the throughput the learner needs, and end-to-end tokens/s.

    The background of each step is shaded by its own verdict (red: generation-bound, blue: training-bound).
    """
    from matplotlib.patches import Patch

    recs = [r for r in records if r.get("timeline")]
    if not recs:
        raise ValueError("no records with a timeline to plot")
    vs = step_verdicts(recs, ctx)
    steps = [int(r.get("step", i)) for i, r in enumerate(recs)]
    e2e = [_num(r.get("response_tokens")) / _num(r.get("step_s"), math.inf) for r in recs]
    fig = _new_figure(9, 4)
    ax = fig.add_subplot(1, 1, 1)
    for s, v in zip(steps, vs):
        if v.kind in KIND_SHADE:
            ax.axvspan(s - 0.5, s + 0.5, color=KIND_SHADE[v.kind], linewidth=0)
    ax.plot(steps, [v.gen_tokens_per_s for v in vs], "o-", color=PHASE_COLORS["generate"], label="generation")
    ax.plot(steps, [v.required_tokens_per_s for v in vs], "s-", color=PHASE_COLORS["train"], label="learner needs")
    ax.plot(steps, e2e, "^-", color="black", label="end to end")
    positive = [x for v in vs for x in (v.gen_tokens_per_s, v.required_tokens_per_s) if x > 0] + [x for x in e2e if x > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("response tokens / s")
    ax.set_title("throughput per step (shading: the step's verdict)", fontsize=10)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Patch(color=c, label=KIND_LABEL[k]) for k, c in KIND_SHADE.items()]
    ax.legend(handles=handles, fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def plot_reward(records: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Mean reward per step, with a band of one standard deviation, and the held-out eval (pass@k) where the
    run evaluated."""
    if not records:
        raise ValueError("no records to plot")
    steps = [int(r.get("step", i)) for i, r in enumerate(records)]
    mean = [_num(r.get("reward_mean")) for r in records]
    std = [_num(r.get("reward_std")) for r in records]
    fig = _new_figure(9, 3.5)
    ax = fig.add_subplot(1, 1, 1)
    ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                    color="#9ecae1", alpha=0.5, linewidth=0, label="± 1 std")
    ax.plot(steps, mean, "o-", color="#08519c", markersize=3, label="mean reward")
    for key in sorted({k for r in records for k in r if k.startswith("eval/pass@")}):
        points = [(s, _num(r[key])) for s, r in zip(steps, records) if key in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], "s--", color="#d94801", markersize=5,
                label=f"held-out {key.removeprefix('eval/')}")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title("reward per step", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def balance_summary(records: Sequence[Mapping[str, Any]], ctx: BalanceContext = NO_CONTEXT,
                    warmup: int = DEFAULT_WARMUP) -> dict[str, Any]:
    """Flat numbers of the run's balance (means past warm-up, the spread and median of the step times beside) and
    its end-to-end throughput."""
    v = summarize(records, ctx, warmup=warmup)
    use = list(records[warmup:]) if len(records) > warmup else list(records)
    wall = sum(_num(r.get("step_s")) for r in use)
    tokens = sum(_num(r.get("response_tokens")) for r in use)
    out: dict[str, Any] = {"tokens_per_s_end_to_end": tokens / wall if wall > 0 else 0.0, "steps": len(records)}
    if v is not None:
        d = v.to_dict()
        out.update({k: d[k] for k in ("kind", "ratio", "learner_wait_frac", "engine_idle_frac", "gen_tokens_per_s",
                                      "required_tokens_per_s", "sync_s", "step_s", "step_median_s", "spread",
                                      "partial_gain", "advice")})
    return out


def steps_label(v: Verdict) -> str:
    """Which steps a run's verdict sums up, and how far their times spread: "means over steps 1-9, steps spread
    1.1x"."""
    if v.steps <= 1:
        return f"step {v.step}"
    return f"means over steps {v.first_step}-{v.step}, steps spread {v.spread:.1f}x"


def print_summary(records: Sequence[Mapping[str, Any]], ctx: BalanceContext = NO_CONTEXT, console=None) -> None:
    """The end-of-run balance as a rich table, then the advice."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(soft_wrap=True)
    v = summarize(records, ctx)
    if v is None:
        console.print("balance: no step has a timeline", highlight=False)
        return
    e2e = balance_summary(records, ctx)["tokens_per_s_end_to_end"]
    t = Table(title=f"balance over {v.steps} step(s) ({steps_label(v)})", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value")
    t.add_row("verdict", f"[bold]{KIND_LABEL[v.kind]}[/] (generate / train time {v.ratio:.2f})")
    t.add_row("step", f"{v.step_s:.3g} s" + (f" (median {v.step_median_s:.3g} s, {v.step_min_s:.3g}-{v.step_max_s:.3g} s)"
                                              if v.steps > 1 else ""))
    t.add_row("learner waited", f"{v.learner_wait_s:.3g} s ({v.learner_wait_frac:.0%} of the step)")
    t.add_row("engines idle", f"{v.engine_idle_s:.3g} s ({v.engine_idle_frac:.0%} of the step)")
    t.add_row("generation", f"{v.gen_tokens_per_s:,.0f} tok/s")
    t.add_row("learner needs", f"{v.required_tokens_per_s:,.0f} tok/s")
    t.add_row("end to end", f"{e2e:,.0f} tok/s")
    t.add_row("weight sync", f"{v.sync_s:.3g} s")
    if v.partial_gain is not None:
        t.add_row("tail waited for", f"{v.partial_gain * v.step_s:.3g} s ({v.partial_gain:.0%} of the step), nothing "
                                     "else generating")
    console.print(t)
    console.print(escape(v.advice), highlight=False)


def write_report(out_dir: str | Path, records: Sequence[Mapping[str, Any]], ctx: BalanceContext = NO_CONTEXT,
                 last_n: int = 8) -> dict[str, Path]:
    """timeline.png, throughput.png and reward.png in out_dir; returns their paths by name."""
    out = Path(out_dir)
    recs = list(records)
    paths: dict[str, Path] = {}
    if any(r.get("timeline") for r in recs):
        paths["timeline"] = plot_timeline(recs, out / "timeline.png", last_n, ctx)
        paths["throughput"] = plot_throughput(recs, out / "throughput.png", ctx)
    if recs:
        paths["reward"] = plot_reward(recs, out / "reward.png")
    return paths


def load_run(run_dir: str | Path) -> tuple[list[dict], BalanceContext]:
    """A run directory's records (metrics.jsonl) and the balance context of its plan.json, if present."""
    run_dir = Path(run_dir)
    with open(run_dir / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f if line.strip()]
    plan = run_dir / "plan.json"
    ctx = context_from_plan(json.loads(plan.read_text())) if plan.is_file() else BalanceContext()
    return records, ctx


def report_run_dir(run_dir: str | Path, last_n: int = 8, console=None) -> dict[str, Path]:
    """Write the PNGs of a finished (or stopped) run next to its metrics and print its balance summary."""
    records, ctx = load_run(run_dir)
    paths = write_report(run_dir, records, ctx, last_n)
    print_summary(records, ctx, console)
    return paths
