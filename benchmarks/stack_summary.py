"""Tally the stack samples that benchmarks/stack_sampler writes, to see where a process spent a time window.

    python benchmarks/stack_summary.py DIR [--pid PID] [--from T0] [--to T1] [--depth 3] [--top 15] [--thread MainThread]

Lists each process (pid, argv, first and last sample) and, for the chosen ones, the most frequent innermost
`depth` frames in the window, each with its share of samples and the seconds it covers.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--pid", default="")
    ap.add_argument("--from", dest="t0", type=float, default=0.0)
    ap.add_argument("--to", dest="t1", type=float, default=1e12)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--thread", default="")
    ap.add_argument("--period", type=float, default=0.25)
    args = ap.parse_args()
    for path in sorted(glob.glob(os.path.join(args.dir, "stacks-*.txt"))):
        pid = path.rsplit("-", 1)[1].split(".")[0]
        if args.pid and pid not in args.pid.split(","):
            continue
        head, tally, times = "", collections.Counter(), []
        with open(path) as f:
            for line in f:
                if line.startswith("#"):
                    head = line.strip()
                    continue
                stamp, _, rest = line.partition(" ")
                thread, _, stack = rest.partition(" | ")
                t = float(stamp)
                times.append(t)
                if not (args.t0 <= t <= args.t1) or (args.thread and thread != args.thread):
                    continue
                tally[(thread, " < ".join(stack.strip().split(" < ")[: args.depth]))] += 1
        if not times:
            continue
        print(f"{head}  [{min(times):.1f} .. {max(times):.1f}]")
        total = sum(tally.values())
        for (thread, stack), n in tally.most_common(args.top):
            print(f"  {n / total:6.1%} {n * args.period:7.1f}s  {thread}: {stack}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
