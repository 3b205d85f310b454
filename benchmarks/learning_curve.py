"""A run's reward against wall-clock time, from its run directory: what `make smoke-gpu`'s record shows.

    python benchmarks/learning_curve.py RUN_DIR --launch EPOCH_SECONDS [--out OUT.json] [--png OUT.png]

Reads RUN_DIR/metrics.jsonl (each line's "t_end" is when the step ended) and writes, per step, the seconds since
the command was launched and the step's mean reward; then the mean reward of the first and the last 20% of the
steps, their difference (the gain), the seconds from launch to the first and the last step, and whether the run
gained at least --min-gain within --within seconds of launch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def curve(records: list[dict], launch: float) -> list[dict]:
    return [{"step": r["step"], "seconds": round(float(r["t_end"]) - launch, 2), "reward": float(r["reward_mean"])}
            for r in records]


def summary(points: list[dict], min_gain: float, within: float) -> dict:
    n = max(1, len(points) // 5)
    first = sum(p["reward"] for p in points[:n]) / n
    last = sum(p["reward"] for p in points[-n:]) / n
    return {
        "steps": len(points),
        "reward_first_20pct": round(first, 4),
        "reward_last_20pct": round(last, 4),
        "gain": round(last - first, 4),
        "first_step_s": points[0]["seconds"] if points else None,
        "last_step_s": points[-1]["seconds"] if points else None,
        "passed": bool(points) and last - first >= min_gain and points[-1]["seconds"] <= within,
        "target": f"gain >= {min_gain} within {within:.0f} s of launch",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--launch", type=float, required=True, help="when the command was launched (epoch seconds)")
    ap.add_argument("--out")
    ap.add_argument("--png")
    ap.add_argument("--min-gain", type=float, default=0.2)
    ap.add_argument("--within", type=float, default=300.0)
    args = ap.parse_args()
    run = Path(args.run_dir)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    points = curve(records, args.launch)
    result = {"run_dir": str(run), **summary(points, args.min_gain, args.within), "curve": points}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([p["seconds"] for p in points], [p["reward"] for p in points], lw=1)
        ax.set_xlabel("seconds since launch")
        ax.set_ylabel("mean reward")
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
