"""A run stopped with Ctrl-C and resumed, as a user would do it, timed: on CPU or on a GPU host (the DeepSpeed
learner's own checkpoint is what resumes there).

    python benchmarks/resume_check.py OUT STOP_AT [overrides ...]
    python benchmarks/resume_check.py /tmp/rc 6 steps=12                                    # CPU, tiny
    python benchmarks/resume_check.py /tmp/rc 6 engine=vllm hardware=2xh200 model=qwen2_5_1_5b steps=12   # GPU

Starts `rlgen train` (hydra.run.dir=OUT/run), sends SIGINT to its process group once STOP_AT steps are logged,
then runs the printed resume command. Writes OUT/resume_check.json: both exit codes, the stop line, the step
it stopped at, the checkpoint's size and write time, both runs' wall and start-up times, and whether
metrics.jsonl ends with every step exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    out, stop_at, overrides = Path(argv[0]), int(argv[1]), argv[2:]
    run = out / "run"
    cmd = [sys.executable, "-m", "rlgen.cli", "train", "progress=false", f"hydra.run.dir={run}", *overrides]
    metrics = run / "metrics.jsonl"
    t0 = time.time()
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    first_step_at = None
    while first.poll() is None and not (metrics.is_file() and len(metrics.read_text().splitlines()) >= stop_at):
        if first_step_at is None and metrics.is_file() and metrics.read_text():
            first_step_at = time.time() - t0
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGINT)
    stopped_at = time.time() - t0
    text, _ = first.communicate(timeout=900)
    stop_lines = [ln for ln in text.splitlines() if "stopped at step" in ln]
    status = json.loads((run / "status.json").read_text())
    ckpt = Path(status["checkpoint"]) if status.get("checkpoint") else None
    t1 = time.time()
    second = subprocess.run([*cmd, f"resume={run}"], capture_output=True, text=True, timeout=1800)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = int(next((o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("steps=")), "150"))
    log = (run / "run.log").read_text()
    written = [float(line.split(" written in ")[1].split(" s")[0]) for line in log.splitlines() if " written in " in line]
    result = {
        "overrides": overrides,
        "first": {"rc": first.returncode, "stop_line": stop_lines[-1] if stop_lines else None,
                  "first_step_s": first_step_at, "signal_at_s": stopped_at, "wall_s": t1 - t0},
        "stopped_at_step": status.get("step"),
        "checkpoint": {"path": str(ckpt) if ckpt else None,
                       "bytes": sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) if ckpt else 0},
        "checkpoint_write_s": written,
        "resume": {"rc": second.returncode, "wall_s": time.time() - t1, "stderr_tail": second.stderr[-1500:]},
        "steps_once_each": [r["step"] for r in records] == list(range(steps)),
        "around_the_stop": [{k: r.get(k) for k in ("step", "reward_mean", "loss", "grad_norm", "version")}
                            for r in records if abs(r["step"] - (status.get("step") or 0)) <= 2],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "resume_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if first.returncode == 130 and second.returncode == 0 and result["steps_once_each"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
