"""What a checkpoint costs: seconds per checkpoint and bytes on disk, beside the median step, in one run.

    python benchmarks/checkpoint_cost.py OUT [overrides ...]
    python benchmarks/checkpoint_cost.py /tmp/ck steps=60 checkpoint.every=10                 # tiny, CPU
    python benchmarks/checkpoint_cost.py /tmp/ck engine=vllm hardware=2xh200 model=qwen2_5_1_5b steps=12 \\
        checkpoint.every=4                                                                     # 1.5B, GPU

Runs `rlgen train` with the overrides (hydra.run.dir=OUT/run), then writes OUT/checkpoint_cost.json: every
checkpoint's seconds (the learner's save, the tokenizer, the state files and the rename), the newest
checkpoint's size by part, the median step, and their ratio.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str]) -> int:
    out, overrides = Path(argv[0]), argv[1:]
    run = out / "run"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "rlgen.cli", "train", "progress=false", f"hydra.run.dir={run}",
                           *overrides], text=True)
    if proc.returncode != 0:
        return proc.returncode
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    newest = sorted((run / "checkpoints").glob("step_*"))[-1]
    seconds = summary["checkpoint_seconds"]
    step_s = statistics.median(r["step_s"] for r in records[1:]) if len(records) > 1 else records[0]["step_s"]
    result = {
        "overrides": overrides,
        "checkpoints": len(seconds),
        "checkpoint_seconds": seconds,
        "checkpoint_s_median": statistics.median(seconds),
        "step_s_median": step_s,
        "checkpoint_over_step": statistics.median(seconds) / step_s,
        "bytes": {part.name: folder_bytes(part) if part.is_dir() else part.stat().st_size for part in newest.iterdir()},
        "bytes_total": folder_bytes(newest),
        "wall_s": time.time() - t0,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
