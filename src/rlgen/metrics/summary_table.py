"""The run summary as the terminal shows it at the end: a few rows, rounded, with units. summary.json keeps every
number in full; the step's times and throughput are in the balance table that follows (metrics.report), the
start-up in its own (runtime.start.progress)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def _seconds(x: float) -> str:
    return f"{x:.2g} s" if x < 1 else f"{x:.3g} s" if x < 100 else f"{x:,.0f} s"


def _num(summary: Mapping[str, Any], key: str) -> float | None:
    v = summary.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def summary_rows(summary: Mapping[str, Any], out_dir: str | Path | None = None) -> list[tuple[str, str]]:
    """(what, value) rows of the run summary, for the keys the summary has."""
    rows: list[tuple[str, str]] = []

    def n(key: str) -> float | None:
        return _num(summary, key)

    if "steps" in summary:
        wall = n("wall_s")
        rows.append(("steps", f"{summary['steps']}" + (f" in {_seconds(wall)}" if wall is not None else "")))
    first, last = n("reward_first_20pct"), n("reward_last_20pct")
    if first is not None and last is not None:
        rows.append(("reward", f"{first:.3f} -> {last:.3f} ({last - first:+.3f}), first to last 20% of steps"))
    stale = n("max_staleness")
    if stale is not None:
        rows.append(("staleness", "0 (on-policy)" if stale == 0 else f"up to {stale:.0f} policy versions behind"))
    faults = [f"{n(key):.0f} {what}" for key, what in (("skipped_steps", "steps skipped"),
                                                       ("engine_restarts", "engine restarts")) if n(key) is not None]
    if faults:
        rows.append(("faults", ", ".join(faults)))
    rows += [(f"held-out {k.removeprefix('eval/')}", str(v) if isinstance(v, int) else f"{n(k):.3f}")
             for k, v in summary.items() if k.startswith("eval/") and n(k) is not None]
    if n("gpu_busy_pct") is not None:
        rows.append(("GPUs busy", f"{n('gpu_busy_pct'):.0f}% (mean over the loop)"))
    ckpt = [float(s) for s in summary.get("checkpoint_seconds") or []]
    if ckpt:
        rows.append(("checkpoints", f"{len(ckpt)}, {_seconds(statistics.median(ckpt))} each (median)"))
    rows += [(what, str(summary[key])) for key, what in (("model_path", "final model"),
                                                         ("merged_model_path", "merged model")) if summary.get(key)]
    if out_dir is not None:
        rows.append(("run directory", str(out_dir)))
    return rows


def print_run_summary(summary: Mapping[str, Any], console: Console, out_dir: str | Path | None = None) -> None:
    rows = summary_rows(summary, out_dir)
    if not rows:
        return
    t = Table(title="run summary", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", overflow="fold")  # a path is folded onto the next line, never cut short
    for what, value in rows:
        t.add_row(what, value)
    console.print(t)


__all__ = ["print_run_summary", "summary_rows"]
