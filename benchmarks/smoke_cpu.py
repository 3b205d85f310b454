"""Wall time and peak memory of `make smoke` (the embedded default run) on CPU.

Runs the command in a subprocess and samples the resident memory of its whole process tree (driver, Ray's
own processes and every actor) from /proc every 0.2 s. Linux only.

    python benchmarks/smoke_cpu.py [-- command ...]      # default command: make smoke
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_mib(root: int) -> float:
    tree, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        total += _rss_kib(pid)
        todo.extend(tree.get(pid, []))
    return total / 1024


def main() -> int:
    cmd = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else ["make", "smoke"]
    log = tempfile.TemporaryFile(mode="w+")
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, tree_rss_mib(proc.pid))
        time.sleep(0.2)
    wall = time.time() - t0
    log.seek(0)
    out = log.read()
    summary = next((json.loads(x) for x in reversed(out.splitlines()) if x.startswith('{"reward_first')), {})
    result = {
        "command": " ".join(cmd),
        "returncode": proc.returncode,
        "wall_s": round(wall, 1),
        "peak_rss_mib": round(peak),
        **summary,
    }
    print(json.dumps(result, indent=2))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
