"""Two runs of one seed, step by step: which of their metrics are equal bit for bit. Clock readings (seconds,
tokens per second, the timeline, the balance verdict) differ between any two runs and are left out; every other
number of each step's metrics.jsonl line is compared, the batch's digests among them (``digest/tokens`` and
``digest/engine_logprobs``: the CRC-32s of the step's token ids and engine logprobs, rlgen.runtime.step.line).

    python benchmarks/same_run.py RUN_A RUN_B [--out same.json]

Exit 0 where every compared number of every step is equal, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

CLOCK_KEYS = {"t_end", "tokens_per_s", "timeline", "balance", "overlap_efficiency"}


def is_clock(key: str) -> bool:
    """A reading of the clock: seconds (``*_s``, ``*_s_*``), rates and the timeline."""
    leaf = key.rsplit("/", 1)[-1]
    return key in CLOCK_KEYS or leaf.endswith("_s") or "_s_" in leaf or leaf.endswith("per_s")


def records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(run_a: Path, run_b: Path) -> dict:
    ra, rb = records(run_a), records(run_b)
    keys = sorted({k for r in ra + rb for k, v in r.items()
                   if not is_clock(k) and isinstance(v, (int, float)) and not isinstance(v, bool)})
    differ: dict[str, dict] = {}
    for k in keys:
        for step, (x, y) in enumerate(zip(ra, rb)):
            if not same(x.get(k), y.get(k)):
                d = abs(x[k] - y[k]) if isinstance(x.get(k), (int, float)) and isinstance(y.get(k), (int, float)) else None
                differ[k] = {"first_step": step, "a": x.get(k), "b": y.get(k), "abs_diff": d}
                break
    return {"runs": [str(run_a), str(run_b)], "steps": [len(ra), len(rb)], "compared": len(keys),
            "equal": len(keys) - len(differ), "differ": differ,
            "digests_equal": all(k not in differ for k in ("digest/tokens", "digest/engine_logprobs"))
            and any(k == "digest/tokens" for k in keys),
            "identical": len(ra) == len(rb) and not differ}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rep = compare(args.run_a, args.run_b)
    print(f"{rep['steps'][0]} and {rep['steps'][1]} steps; {rep['equal']} of {rep['compared']} metrics equal at "
          f"every step; batch digests {'equal' if rep['digests_equal'] else 'NOT equal'}")
    for k, d in rep["differ"].items():
        print(f"  {k}: first differs at step {d['first_step']}: {d['a']!r} against {d['b']!r}")
    if args.out:
        args.out.write_text(json.dumps(rep, indent=1))
    sys.exit(0 if rep["identical"] else 1)


if __name__ == "__main__":
    main()
