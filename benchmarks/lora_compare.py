"""Full fine-tuning beside LoRA (adapters to vLLM, and merged weights), side by side on one host: step time, the
weight update's time, generation speed, memory and engine/learner logprob mismatch of each, from real runs.

    python benchmarks/lora_compare.py OUT SIDES [overrides ...]
    python benchmarks/lora_compare.py /tmp/lc full,adapter,merged engine=vllm hardware=1xh100 model=qwen2_5_1_5b \\
        steps=8 algo.max_new_tokens=256
    python benchmarks/lora_compare.py /tmp/lc adapter engine=vllm hardware=1xh100 model=qwen2_5_7b steps=5

SIDES is a comma-separated list of:
    full      learner.lora.enabled=false (full fine-tuning)
    adapter   learner.lora.enabled=true learner.lora.sync=adapter (vLLM's LoRA: the engine keeps the base)
    merged    learner.lora.enabled=true learner.lora.sync=merged (the learner merges and sends whole weights)
    plan      nothing added: what the plan picks for the overrides

Each side is one `rlgen train` (hydra.run.dir=OUT/<side>) while nvidia-smi is polled for the GPU's memory in use.
OUT/lora_compare.json gets, per side: the median step, train, generate and weight-update (sync) seconds over the
steps after the first, generation tokens/s, the learner's peak GPU memory (torch's allocator), the GPU's peak in
use, the mean engine/learner |delta logprob| and k3 KL, the plan's LoRA settings and memory split, time to the
first rollout, and the update's learner and engine parts; and the ratios of every side to the first.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

SIDES = {
    "full": ["learner.lora.enabled=false"],
    "adapter": ["learner.lora.enabled=true", "learner.lora.sync=adapter"],
    "merged": ["learner.lora.enabled=true", "learner.lora.sync=merged"],
    "plan": [],
}
MEDIANS = ("step_s", "train_s", "generate_s", "sync_s", "tokens_per_s")


class GpuMemory:
    """The GPU's memory in use (MiB, nvidia-smi), polled every half second; peak() is the most seen."""

    def __init__(self) -> None:
        self.most, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.done.wait(0.5):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                self.most = max([self.most, *(int(v) for v in out.split() if v.strip().isdigit())])
            except (OSError, subprocess.SubprocessError):
                return

    def peak_gib(self) -> float:
        self.done.set()
        self.thread.join(timeout=5)
        return round(self.most / 1024, 2)


def update_parts(records: list[dict]) -> dict:
    """The weight update split in two, medians from each step's timeline: the learner's part (export, and the
    push where the learner sends) and the engines' part (the slowest engine's load)."""
    learner, engine = [], []
    for r in records:
        spans = [s for s in r.get("timeline", []) if s.get("phase") == "sync"]
        learner.append(sum(s["end"] - s["start"] for s in spans if s["actor"].startswith("learner")))
        engine.append(max((s["end"] - s["start"] for s in spans if not s["actor"].startswith("learner")), default=0.0))
    if not records:
        return {}
    return {"update_learner_s_median": round(statistics.median(learner), 4),
            "update_engine_s_median": round(statistics.median(engine), 4)}


def side(out: Path, name: str, overrides: list[str]) -> dict:
    run = out / name
    memory = GpuMemory()
    t0 = time.time()
    cmd = [sys.executable, "-m", "rlgen.cli", "train", "progress=false", f"hydra.run.dir={run}", *overrides, *SIDES[name]]
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    result: dict = {"side": name, "command": " ".join(["rlgen", *cmd[3:]]), "rc": rc, "wall_s": round(time.time() - t0, 1),
                    "gpu_peak_gib": memory.peak_gib()}
    if rc != 0 or not (run / "summary.json").is_file():
        result["log_tail"] = (out / f"{name}.log").read_text()[-3000:]
        return result
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    later = records[1:] or records
    result.update({f"{k}_median": round(statistics.median(r[k] for r in later), 4) for k in MEDIANS if k in later[0]})
    result.update(update_parts(later))
    result.update(
        steps=len(records),
        learner_peak_gib=round(max(r.get("learner_peak_gib", 0.0) for r in records), 2),
        mismatch_mean_abs_delta=statistics.mean(r["mismatch/mean_abs_delta"] for r in records),
        mismatch_k3_kl=statistics.mean(r["mismatch/k3_kl"] for r in records),
        first_rollout_s=summary.get("first_rollout_s"),
        sync_warmup_s=summary.get("sync_warmup_s"),
        reward_first_20pct=summary.get("reward_first_20pct"),
        reward_last_20pct=summary.get("reward_last_20pct"),
    )
    plan = json.loads((run / "plan.json").read_text()) if (run / "plan.json").is_file() else {}
    result["plan"] = {k: plan.get(k) for k in ("transport", "memory") if k in plan}
    result["plan"]["lora"] = plan.get("config", {}).get("learner", {}).get("lora")
    checkpoint = Path(summary["checkpoint_path"]) if summary.get("checkpoint_path") else None
    if checkpoint and checkpoint.is_dir():
        result["checkpoint_bytes"] = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
    return result


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    out, names, overrides = Path(argv[0]), argv[1].split(","), argv[2:]
    unknown = [n for n in names if n not in SIDES]
    if unknown:
        print(f"unknown side(s) {unknown}; choose from {sorted(SIDES)}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in names:
        results.append(side(out, name, overrides))
        print(json.dumps(results[-1])[:1500], flush=True)
        (out / "lora_compare.json").write_text(json.dumps({"overrides": overrides, "sides": results}, indent=1))
    first = results[0]
    ratios = {}
    for r in results[1:]:
        ratios[r["side"]] = {k: round(r[k] / first[k], 3) for k in (*[f"{m}_median" for m in MEDIANS],
                                                                     "learner_peak_gib", "gpu_peak_gib")
                             if isinstance(r.get(k), (int, float)) and isinstance(first.get(k), (int, float)) and first[k]}
    (out / "lora_compare.json").write_text(json.dumps({"overrides": overrides, "sides": results,
                                                       f"ratios_to_{first['side']}": ratios}, indent=1))
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
