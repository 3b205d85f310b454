"""An engine killed in the middle of an NCCL weight update: its vLLM engine core gets SIGKILL DELAY_MS after the
engine starts receiving update UPDATE; the run must free the learner's broadcast, re-create the engine, form a new
weight-transfer group and finish every step.

    python benchmarks/kill_in_nccl_update.py OUT [--update 3] [--delay-ms 5] [OVERRIDES ...]

Trains in this process (``run_training``) with rlgen's vLLM engine class, subclassed so that its first incarnation
kills its own engine core (the actor's child process) DELAY_MS after ``receive_weights`` of version UPDATE
begins, while the learner broadcasts. Default overrides: two GPUs, the engine on one and the learner on the other,
weights over NCCL. Writes OUT/kill_in_nccl_update.json: the exit, steps, restarts, each step's sync time, when the
kill landed, whether the learner's broadcast had to be aborted (it was still waiting on the dead engine) and the
run's last lines. Linux only (reads /proc).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

DEFAULTS = ["engine=vllm", "hardware=2xh200", "hardware.gpu.name=H100-SXM-80GB", "hardware.gpu.memory_gb=80",
            "model=qwen2_5_1_5b", "steps=8", "algo.max_new_tokens=128", "engine.weights_over=nccl", "progress=false",
            "checkpoint.every=0", "engine.keep_warm_s=0"]


def children(pid: int) -> list[int]:
    """The processes whose parent is pid."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def killing_engine(base: type, update: int, delay_s: float, mark: str) -> type:
    """base, whose first incarnation (mark: a file made once, across incarnations) SIGKILLs its engine core
    delay_s after it starts receiving version ``update``."""

    class KilledInUpdate(base):  # type: ignore[misc, valid-type]
        def receive_weights(self, update_info, version, timeout_s=60.0, *, pause=False):  # noqa: ANN001, ANN201
            if int(version) == update and _claim(mark):
                def kill() -> None:
                    time.sleep(delay_s)
                    pids = children(os.getpid())
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    Path(mark).write_text(json.dumps({"at": time.time(), "killed": pids, "version": update}))

                threading.Thread(target=kill, daemon=True).start()
            return super().receive_weights(update_info, version, timeout_s, pause=pause)

    KilledInUpdate.__name__ = KilledInUpdate.__qualname__ = base.__name__
    return KilledInUpdate


def _claim(mark: str) -> bool:
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def main(argv: list[str]) -> int:
    import ray.cloudpickle
    from rich.console import Console

    from rlgen.config.compose import compose_run_config
    from rlgen.metrics.sink import read_jsonl
    from rlgen.plan import build_plan
    from rlgen.runtime.cluster.actors import engine_class
    from rlgen.runtime.run import run_training

    out = Path(argv[0])
    rest = argv[1:]
    update, delay_ms = 3, 5.0
    while rest and rest[0].startswith("--"):
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "--update":
            update = int(value)
        elif flag == "--delay-ms":
            delay_ms = float(value)
    out.mkdir(parents=True, exist_ok=True)
    mark = str(out / "killed.json")
    Path(mark).unlink(missing_ok=True)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    overrides = [*DEFAULTS, *rest]
    cfg = compose_run_config(overrides)
    plan = build_plan(cfg)
    base, kwargs = engine_class(plan)  # the kind's own class and arguments (its weight-transfer settings among them)
    run_dir = out / "run"
    result: dict = {"overrides": overrides, "update": update, "delay_ms": delay_ms}
    t0 = time.time()
    try:
        summary = run_training(plan, run_dir, Console(), engine_cls=killing_engine(base, update, delay_ms / 1000, mark),
                               engine_kwargs=kwargs)
        result.update(rc=0, summary={k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
    except Exception as err:  # noqa: BLE001 - recorded: the benchmark reports, it does not pass or fail silently
        result.update(rc=1, error=f"{type(err).__name__}: {err}"[:2000])
    result["wall_s"] = time.time() - t0
    recs = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
    result["steps"] = len(recs)
    result["engine_restarts"] = [r.get("engine_restarts") for r in recs]
    result["sync_s"] = [r.get("sync_s") for r in recs]
    result["step_s"] = [r.get("step_s") for r in recs]
    result["killed"] = json.loads(Path(mark).read_text() or "{}") if Path(mark).is_file() else None
    log = run_dir / "run.log"
    text = log.read_text() if log.is_file() else ""
    result["log_tail"] = text[-3000:]
    # the update was cut mid-broadcast when the learner's side had to be aborted (the driver logs it)
    result["learner_broadcast_aborted"] = "weight-transfer group was aborted" in text
    result["passed"] = bool(result["rc"] == 0 and result["steps"] == cfg.steps and result["killed"]
                            and any(r for r in result["engine_restarts"] if r))
    (out / "kill_in_nccl_update.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
