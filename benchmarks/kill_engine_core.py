"""The vLLM engine core dies under a run: SIGKILL of the EngineCore process once the run has logged STEP steps;
the run must re-create that engine in place and finish with one restart counted.

    python benchmarks/kill_engine_core.py OUT [--step 3] [--steps 10] [OVERRIDES ...]

Runs ``rlgen train engine=vllm hardware=1xh100 model=small steps=10`` (plus OVERRIDES) in a subprocess with its run
directory under OUT, kills every process whose title or command line names vLLM's EngineCore once
metrics.jsonl has STEP lines, and writes OUT/kill_engine_core.json: the exit code, the step it was killed at,
each step's engine_restarts, the run's last lines, and whether it passed (exit 0, all steps, one restart).
Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def engine_core_pids() -> list[int]:
    """Processes whose name or command line says EngineCore (vLLM titles its core process so)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            comm = (entry / "comm").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "EngineCore" in comm or "EngineCore" in cmd:
            pids.append(int(entry.name))
    return pids


def lines(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--step", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=540.0)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    cmd = [sys.executable, "-m", "rlgen.cli", "train", "engine=vllm", "hardware=1xh100", "model=small",
           f"steps={args.steps}", "checkpoint.every=0", f"hydra.run.dir={run_dir}", *args.overrides]
    t0 = time.time()
    log = open(out / "kill_engine_core.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    killed, killed_at = [], None
    while proc.poll() is None and time.time() - t0 < args.timeout:
        done = len(lines(run_dir / "metrics.jsonl"))
        if killed_at is None and done >= args.step:
            killed = engine_core_pids()
            for pid in killed:
                os.kill(pid, signal.SIGKILL)
            killed_at = done
            print(f"killed EngineCore {killed} after {done} steps, {time.time() - t0:.1f} s after launch", flush=True)
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    records = lines(run_dir / "metrics.jsonl")
    restarts = [r.get("engine_restarts") for r in records]
    result = {
        "command": " ".join(cmd[1:]), "exit_code": proc.returncode, "seconds": round(time.time() - t0, 1),
        "killed_pids": killed, "killed_after_steps": killed_at, "steps_logged": len(records),
        "engine_restarts": restarts,
        "passed": proc.returncode == 0 and len(records) == args.steps and bool(killed) and restarts[-1:] == [1],
        "tail": (out / "kill_engine_core.log").read_text().splitlines()[-15:],
    }
    (out / "kill_engine_core.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "tail"}, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
