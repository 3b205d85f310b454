"""Runs side by side by their step breakdown: what each trained (real response tokens a step, the packed tokens the
learners forwarded, micro-batches), how long its phases took (medians over the steps after the first: generate,
train, the step), the generation tail (rlgen.runtime.rollouts.tail), and the learner's measured peak memory
against the plan's. The first run is the base every ratio is to.

    python benchmarks/lengths_report.py RUN_DIR [RUN_DIR ...] [--out report.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

KEYS = ("generate_s", "train_s", "step_s", "response_tokens", "packed_tokens", "micro_batches", "gen/tail_s",
        "gen/tail_filled", "sync_s", "staleness", "partial/carried", "partial/cut_tokens")


def run_summary(run: Path) -> dict:
    """One run's medians over steps 1.. (step 0 starts the engines and generates alone), its lengths and memory."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    later = records[1:] or records
    plan = json.loads((run / "plan.json").read_text())
    out: dict = {"run": run.name, "steps": len(records)}
    for key in KEYS:
        values = [r[key] for r in later if key in r]
        if values:
            out[key] = round(statistics.median(values), 3)
    mean_len = [r["response_tokens"] / max(r["sequences"], 1) for r in later]
    out["mean_response_tokens"] = round(statistics.fmean(mean_len), 1) if mean_len else None
    out["max_new_tokens"] = plan["config"]["algo"]["max_new_tokens"]
    out["micro_batch_tokens"] = plan["config"]["algo"]["micro_batch_tokens"]
    out["attention"] = plan["config"]["learner"]["attention"]
    measured = max((r.get("learner_peak_gib", 0.0) for r in records), default=0.0)
    planned = (plan.get("memory") or {}).get("learner_peak_gib")
    if measured and planned:
        out["learner_peak_gib"] = round(measured, 2)
        out["plan_learner_peak_gib"] = planned
        out["peak_vs_plan"] = round(measured / planned, 3)
    summary = run / "summary.json"
    if summary.is_file():
        out["first_rollout_s"] = json.loads(summary.read_text()).get("first_rollout_s")
    return out


def report(runs: list[Path]) -> dict:
    rows = [run_summary(r) for r in runs]
    base = rows[0]
    for row in rows:
        for key in ("train_s", "generate_s", "step_s"):
            if key in row and base.get(key):
                row[f"{key}_vs_{base['run']}"] = round(row[key] / base[key], 2)
    return {"runs": rows}


def table(rep: dict) -> str:
    cols = ("run", "max_new_tokens", "mean_response_tokens", "response_tokens", "packed_tokens", "micro_batches",
            "train_s", "generate_s", "step_s", "gen/tail_s", "gen/tail_filled", "learner_peak_gib",
            "plan_learner_peak_gib")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in cols) + " |" for row in rep["runs"]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rep = report(args.runs)
    if args.out:
        args.out.write_text(json.dumps(rep, indent=2))
    print(json.dumps(rep))
    print(table(rep))


if __name__ == "__main__":
    main()
