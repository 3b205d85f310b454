"""The recorded comparisons of result JSON files re-stated by the mean step: for every per-step series a file holds,
its steady steps' mean, spread (longest over shortest) and median, and each comparison's ratio of means beside
the ratio of medians it recorded.

    python benchmarks/restate_means.py                          # every file in benchmarks/results
    python benchmarks/restate_means.py benchmarks/results/2026-11-28-h200-packed-learner.json

What counts as a per-step series, and its steady steps:
- a benchmarks/peer_trl.py report (a dict with ``sides``, each side a dict with ``side``; a bare list of such
  sides too): each side's ``step_s`` list, the steady steps as peer_trl.py counts them (after the report's
  ``warmup``, peer_trl.py's default 2 where the report has none; the last step left out). Every side is
  compared to TRL's side (the first side where there is none), and a side of one name in several reports of
  one file (e.g. fixed and RL-shaped lengths) to its first report's;
- a run's metrics records (a list of dicts, each with ``step`` and a number ``step_s``): steps 1.., as
  benchmarks/lengths_report.py counts them. Series side by side in one dict are compared to the first.
Sides without ``step_s`` and benchmarks/lengths_report.py rows (one number a run) hold no per-step data; each
report of them gets one line that says so. Nothing is estimated for them. Other files: one line, "no per-step
series this script reads".
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlgen.metrics.steady import Steady, ratio, steady

HERE = Path(__file__).resolve()
RESULTS = HERE.parent / "results"
PEER_WARMUP = 2  # peer_trl.py's --warmup default


def peer_trl():
    """benchmarks/peer_trl.py as a module, for its steady window (steady_steps)."""
    spec = importlib.util.spec_from_file_location("peer_trl", HERE.parent / "peer_trl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class Series:
    """One side's or one run's steps: where it is in its file, its steady steps, and the median it recorded."""

    where: str  # the JSON path of its report or group
    name: str  # the side or run
    steady: Steady | None
    recorded_median: float | None


# -- finding the series ----------------------------------------------------------------------------------------
def is_side(obj: object) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("side"), str)


def is_record_list(obj: object) -> bool:
    """A run's metrics records: two or more dicts, each with a step and a number step_s."""
    return (isinstance(obj, list) and len(obj) > 1 and all(
        isinstance(r, dict) and "step" in r and isinstance(r.get("step_s"), (int, float)) for r in obj))


def is_lengths_report(obj: object) -> bool:
    """benchmarks/lengths_report.py's output: runs, each one summary row with a number step_s."""
    runs = obj.get("runs") if isinstance(obj, dict) else None
    return (isinstance(runs, list) and bool(runs)
            and all(isinstance(r, dict) and "run" in r and isinstance(r.get("step_s"), (int, float)) for r in runs))


def walk(obj: object, path: str = "") -> Iterator[tuple[str, object]]:
    """(JSON path, value) of every dict and list in obj, obj first."""
    if isinstance(obj, (dict, list)):
        yield path or "/", obj
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for key, value in items:
            yield from walk(value, f"{path}/{key}")


def peer_reports(doc: object) -> Iterator[tuple[str, list[dict], int]]:
    """(path, sides, warmup) of every peer_trl.py report in doc, bare lists of sides included."""
    for path, obj in walk(doc):
        if isinstance(obj, dict) and isinstance(obj.get("sides"), list) and obj["sides"] \
                and all(is_side(s) for s in obj["sides"]):
            yield path, obj["sides"], obj.get("warmup", PEER_WARMUP)
        elif isinstance(obj, list) and obj and all(is_side(s) for s in obj) and not path.endswith("/sides"):
            yield path, obj, PEER_WARMUP


def record_groups(doc: object) -> Iterator[tuple[str, dict[str, list[dict]]]]:
    """(path, {run: its records}) of the metrics record lists in doc, grouped by the dict that holds them side by
    side: runs/<name> lists, and runs/<name>/per_step (or /steps) lists under one runs dict."""
    groups: dict[str, dict[str, list[dict]]] = {}
    for path, obj in walk(doc):
        if not is_record_list(obj):
            continue
        parts = path.strip("/").split("/")
        if len(parts) > 1 and parts[-1] in ("per_step", "steps"):
            parts = parts[:-1]
        group, name = "/" + "/".join(parts[:-1]), parts[-1]
        groups.setdefault(group, {})[name] = obj
    yield from groups.items()


# -- summing up ------------------------------------------------------------------------------------------------
def side_series(where: str, side: dict, warmup: int, window) -> Series:
    """A peer_trl.py side's steady steps (None where it has no step_s)."""
    steps = side.get("step_s")
    return Series(where, side["side"], window(steps, warmup) if steps else None, side.get("median_step_s"))


def run_series(where: str, name: str, records: list[dict]) -> Series:
    """A run's steps 1.. from its metrics records."""
    return Series(where, name, steady([r["step_s"] for r in records], warmup=1), None)


def base_of(series: list[Series]) -> Series:
    """The side every ratio is to: TRL's, else the first."""
    return next((s for s in series if s.name == "trl" and s.steady), series[0])


def div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def num(v: float | None, fmt: str = ".3f", suffix: str = "") -> str:
    return f"{v:{fmt}}{suffix}" if v is not None else "-"


def base_name(s: Series, base: Series) -> str:
    """What a row's ratios are to: (base) on the base's own row, its report's path where that differs."""
    if s is base:
        return "(base)"
    return base.name if base.where == s.where else f"{base.where} {base.name}"


def rows(series: list[Series], base: Series) -> list[str]:
    """Markdown rows: each series by its mean, spread and median, its ratios to base (of the medians recorded
    and of the means), and their inverses (base's step over this one's, as a speed-up)."""
    out = []
    for s in series:
        st = s.steady
        cells = [s.where, s.name, num(st and st.steps, "d"), num(s.recorded_median), num(st and st.median_s),
                 num(st and st.mean_s), num(st and st.min_s), num(st and st.max_s), num(st and st.spread, ".2f"),
                 num(st and st.cv, ".2f"), base_name(s, base),
                 num(div(s.recorded_median, base.recorded_median), ".2f", "x"),
                 num(ratio(st, base.steady), ".2f", "x"),
                 num(div(base.recorded_median, s.recorded_median), ".2f", "x"),
                 num(ratio(base.steady, st), ".2f", "x")]
        out.append("| " + " | ".join(cells) + " |")
    return out


HEADER = ["| where | side or run | steady steps | median s (recorded) | median s (again) | mean s | min s | max s "
          "| spread | cv | ratio to | median ratio (recorded) | mean ratio | its inverse: medians (recorded) | means |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]


def same_side_across(peer: list[list[Series]]) -> list[str]:
    """Rows for a side of one name in several reports of one file, each to its first report's."""
    seen: dict[str, list[Series]] = {}
    for report in peer:
        for s in report:
            if s.steady:
                seen.setdefault(s.name, []).append(s)
    out = []
    for found in seen.values():
        if len(found) > 1:
            out += rows(found, found[0])
    return out


def restate(doc: object) -> list[str]:
    """The lines for one result file: its tables, and one line for each report without per-step data."""
    window = peer_trl().steady_steps
    lines, peer, missing = [], [], []
    for where, sides, warmup in peer_reports(doc):
        series = [side_series(where, s, warmup, window) for s in sides]
        if not any(s.steady for s in series):
            why = ("too few steps once the warm-up and the last are left out" if any("step_s" in s for s in sides)
                   else "no step_s: no per-step data")
            missing.append(f"{where}: sides {', '.join(s.name for s in series)}: {why}")
            continue
        peer.append(series)
        lines += rows(series, base_of(series))
    across = same_side_across(peer)
    for where, group in record_groups(doc):
        series = [run_series(where, name, recs) for name, recs in group.items()]
        lines += rows(series, series[0])
    for where, obj in walk(doc):
        if is_lengths_report(obj):
            names = ", ".join(r["run"] for r in obj["runs"])
            missing.append(f"{where}: lengths_report rows ({names}) hold one number a run, no per-step data")
    out = HEADER + lines if lines else []
    if across:
        out += ["", "The same side across this file's reports, each to its first:", ""] + HEADER + across
    return out + ([""] if out and missing else []) + [f"- {m}" for m in missing]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path, help="result JSON files (default: benchmarks/results/*.json)")
    args = ap.parse_args()
    for path in args.files or sorted(RESULTS.glob("*.json")):
        lines = restate(json.loads(path.read_text()))
        print(f"## {path.name}\n")
        print("\n".join(lines) if lines else "no per-step series this script reads")
        print()


if __name__ == "__main__":
    main()
