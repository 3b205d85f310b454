"""Runs side by side by their step breakdown: what each trained (real response tokens a step, the packed tokens the
learners forwarded, micro-batches), how long its phases took (means over the steady steps: generate, train, the
step), how its steps spread (the longest step over the shortest: about 1 where steps are even, 2 and
more where a short and a long one alternate), its throughput (the real response tokens of those steps over their
seconds, tokens/s), the generation tail (rlgen.runtime.rollouts.tail), and the learner's measured peak memory
against the plan's. The first run is the base every ratio is to; the ratios are of means. The median of the
generate, train and step seconds is kept beside the means (``<key>_median``) only: where steps alternate, it
lands on either. The steady steps are steps 2 to n-2 where a run has four or more: step 0 starts the engines and
generates alone, step 1 waits for the batch launched once step 0's was in, and the last step has nothing
generating beside it (so its learner trains alone, faster); a shorter run keeps what is left after step 0.

    python benchmarks/lengths_report.py RUN_DIR [RUN_DIR ...] [--out report.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rlgen.metrics.steady import steady

KEYS = ("generate_s", "train_s", "step_s", "response_tokens", "packed_tokens", "micro_batches", "gen/tail_s",
        "gen/tail_filled", "sync_s", "staleness", "partial/carried", "partial/cut_tokens")
MEDIAN_KEYS = ("generate_s", "train_s", "step_s")
RATIO_KEYS = ("train_s", "generate_s", "step_s", "tokens_per_s")


STEADY_FIRST, STEADY_TAIL = 2, 1  # steps left out at either end of a run of four or more


def steady_window(n: int) -> tuple[int, int]:
    """(first, tail): the steps left out at the start and the end of a run of n steps."""
    return (STEADY_FIRST, STEADY_TAIL) if n >= 4 else (min(1, n - 1), 0) if n > 0 else (0, 0)


def steady_records(records: list[dict]) -> list[dict]:
    """The records of the steady steps (steady_window); all of them for a one-step run."""
    first, tail = steady_window(len(records))
    return records[first:len(records) - tail] or records


def means(later: list[dict]) -> dict:
    """The mean of each of KEYS over the records that hold it, with the median beside for MEDIAN_KEYS."""
    out: dict = {}
    for key in KEYS:
        values = [r[key] for r in later if key in r]
        if values:
            out[key] = round(statistics.fmean(values), 3)
            if key in MEDIAN_KEYS:
                out[f"{key}_median"] = round(statistics.median(values), 3)
    return out


def step_spread(records: list[dict]) -> dict:
    """How the steps after the first spread (min, max, max/min, coefficient of variation) and the real response
    tokens a second over them, by rlgen.metrics.steady; nothing where the records lack a step's seconds or
    tokens."""
    if not records or not all("step_s" in r and "response_tokens" in r for r in records):
        return {}
    first, tail = steady_window(len(records))
    s = steady([r["step_s"] for r in records], [r["response_tokens"] for r in records], warmup=first, tail=tail)
    if s is None:
        return {}
    return {"step_min_s": round(s.min_s, 3), "step_max_s": round(s.max_s, 3), "step_spread": round(s.spread, 3),
            "step_cv": round(s.cv, 3), "steps_even": s.even, "tokens_per_s": round(s.tokens_per_s, 1)}


def mismatch_by_length(records: list[dict]) -> dict:
    """Engine-vs-trainer mismatch by response length over every step (mismatch/by_length/<bucket>/*): each
    bucket's k3 KL and mean |dlogp| weighted by its tokens, its largest |dlogp| and its tokens."""
    prefix = "mismatch/by_length/"
    buckets = dict.fromkeys(k[len(prefix):].rsplit("/", 1)[0] for r in records for k in r if k.startswith(prefix))
    out: dict = {}
    for b in buckets:
        rows = [r for r in records if f"{prefix}{b}/tokens" in r]
        tokens = sum(r[f"{prefix}{b}/tokens"] for r in rows)
        for stat in ("k3_kl", "mean_abs_delta"):
            out[f"mismatch_{b}_{stat}"] = sum(r[f"{prefix}{b}/{stat}"] * r[f"{prefix}{b}/tokens"] for r in rows) / max(tokens, 1)
        out[f"mismatch_{b}_max_abs_delta"] = max(r[f"{prefix}{b}/max_abs_delta"] for r in rows)
        out[f"mismatch_{b}_tokens"] = tokens
    return out


def run_summary(run: Path) -> dict:
    """One run's means over its steady steps, its step spread and tokens/s, its lengths and memory."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    later = steady_records(records)
    plan = json.loads((run / "plan.json").read_text())
    out: dict = {"run": run.name, "steps": len(records), **means(later), **step_spread(records)}
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
    out.update(mismatch_by_length(records))
    out["precision"] = plan["config"].get("precision", "bf16")
    out["overflow_skips"] = sum(1 for r in records if r.get("overflow_skip"))  # precision=fp16's loss scale
    out["nonfinite_skips"] = sum(1 for r in records if r.get("skipped") and not r.get("overflow_skip"))
    summary = run / "summary.json"
    if summary.is_file():
        out["first_rollout_s"] = json.loads(summary.read_text()).get("first_rollout_s")
    return out


def report(runs: list[Path]) -> dict:
    """Every run's summary, each with its means' ratios to the first run's (<key>_vs_<first run>)."""
    rows = [run_summary(r) for r in runs]
    base = rows[0]
    for row in rows:
        for key in RATIO_KEYS:
            if key in row and base.get(key):
                row[f"{key}_vs_{base['run']}"] = round(row[key] / base[key], 2)
    return {"runs": rows}


def table(rep: dict) -> str:
    """The runs as a markdown table: means (train_s, generate_s, step_s), the step spread and tokens/s."""
    cols = ("run", "max_new_tokens", "mean_response_tokens", "response_tokens", "packed_tokens", "micro_batches",
            "train_s", "generate_s", "step_s", "step_spread", "tokens_per_s", "step_s_median", "gen/tail_s",
            "gen/tail_filled", "learner_peak_gib", "plan_learner_peak_gib")
    base = rep["runs"][0]["run"] if rep["runs"] else ""
    cols += (f"step_s_vs_{base}",)
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
