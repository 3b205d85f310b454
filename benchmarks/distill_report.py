"""On-policy distillation against RL alone, from run directories: when each run's smoothed reward first reaches the
teacher's reward (the mean of its run's last fifth of steps), in steps and in seconds from its first step's start,
with the distilled runs' teacher scoring per step and their reverse KL to the teacher, first and last.

    python benchmarks/distill_report.py TEACHER_RUN DISTILL_RUN [DISTILL_RUN ...] [--rl RL_RUN] [--window 10]
        [--out OUT.json] [--png OUT.png]

RL alone is --rl, or else the teacher's own run: a run of the student's preset from the same start and seed is the
teacher's run step for step. The smoothing and the time to a target are benchmarks/peer_trl.py's (its --learn).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _peer():
    spec = importlib.util.spec_from_file_location("peer_trl_for_distill", HERE / "peer_trl.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def start_of(recs: list[dict]) -> float:
    """When the run's first step began: its end less its length."""
    return float(recs[0]["t_end"]) - float(recs[0]["step_s"])


def last_fifth(recs: list[dict]) -> float:
    k = max(1, len(recs) // 5)
    return statistics.fmean(r["reward_mean"] for r in recs[-k:])


def distill_figures(recs: list[dict]) -> dict:
    """A distilled run's teacher scoring per step (mean, and its share of the mean step) and reverse KL."""
    teacher = [float(r.get("teacher_s", 0.0)) for r in recs]
    gaps = [r["distill/reverse_kl"] for r in recs if "distill/reverse_kl" in r]
    step = statistics.fmean(float(r["step_s"]) for r in recs)
    return {"teacher_s_mean": statistics.fmean(teacher), "teacher_share_of_step": statistics.fmean(teacher) / step,
            "step_s_mean": step, "reverse_kl_first": gaps[0] if gaps else None,
            "reverse_kl_last": gaps[-1] if gaps else None}


def report(teacher: Path, distilled: list[Path], rl: Path | None, window: int) -> dict:
    peer = _peer()
    runs = {"rl": rl or teacher, **{f"distill:{p.name}": p for p in distilled}}
    recs = {name: records(path) for name, path in runs.items()}
    target = last_fifth(records(teacher))
    sides = {name: {"points": peer.read_rlgen_metrics(runs[name] / "metrics.jsonl", start_of(r))[0]}
             for name, r in recs.items()}
    out = peer.learning_summary(sides, window, target=target, base="rl")
    out["teacher"] = {"run": str(teacher), "reward_last_fifth": target, "steps": len(records(teacher))}
    for name, r in recs.items():
        if name != "rl":
            out["sides"][name].update(distill_figures(r))
    out["curves"] = {name: peer.smoothed(side["points"], window) for name, side in sides.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("teacher")
    ap.add_argument("distilled", nargs="+")
    ap.add_argument("--rl")
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--out")
    ap.add_argument("--png")
    args = ap.parse_args()
    result = report(Path(args.teacher), [Path(p) for p in args.distilled], Path(args.rl) if args.rl else None,
                    args.window)
    print(f"target: the teacher's reward {result['target']:.3f} (last fifth of {result['teacher']['steps']} steps)")
    for name, side in result["sides"].items():
        extra = (f", teacher {side['teacher_s_mean']:.3f} s a step ({side['teacher_share_of_step']:.0%} of it), "
                 f"reverse KL {side['reverse_kl_first']:.3f} -> {side['reverse_kl_last']:.3f}"
                 if "teacher_s_mean" in side else "")
        print(f"{name}: reached it at step {side['target_step']} after {side['target_s']} s; best "
              f"{side['best_reward']:.3f}; ratio to rl {side.get('ratio')}{extra}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for name, curve in result["curves"].items():
            ax.plot([p["seconds"] for p in curve], [p["reward"] for p in curve], label=name)
        ax.axhline(result["target"], color="grey", linestyle=":", label="the teacher's reward")
        ax.set_xlabel("seconds from the first step's start")
        ax.set_ylabel(f"reward (mean of {args.window} steps)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
