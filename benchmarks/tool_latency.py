"""Do engines wait for tools? The same run single-turn, multi-turn with instant tools, and multi-turn with a tool
that takes 50-500 ms a call, one after the other on the same GPU.

    python benchmarks/tool_latency.py OUT [--steps 8] [--tokens 512] [--turns 4] [--sides single,turns,tool]
        [--stop-ids K] [--from-runs] [hydra overrides ...]
    python benchmarks/tool_latency.py /tmp/tl engine=vllm model=qwen2_5_0_5b hardware=1xh100        # GPU
    python benchmarks/tool_latency.py /tmp/tl --steps 3 --tokens 16 --turns 2 model.max_position_embeddings=256  # CPU

Sides (each `rlgen train` with hydra.run.dir=OUT/<side>):
- ``single``: ``task=arith``, one completion of ``--tokens`` tokens per prompt;
- ``turns``: benchmarks/envs/slow_tool.py's environment with no latency, ``--turns`` policy turns of
  ``--tokens / --turns`` tokens each and a tool's result between them;
- ``tool``: the same with every tool call taking a random 50-500 ms.

Every side runs with the tool side's ``algo.async_steps`` (the plan's for a multi-turn task: 2 on GPUs), unless
the overrides set it.

``--stop-ids K`` makes K token ids end a turn on every side, so a random-init model's turns end at random points
(RL-shaped lengths) rather than all at the same decode step.

Per side, over the steps after the first two (the results, each also as a share of the single-turn side's):
- ``engine_tokens_per_s``: the policy's tokens over the engines' busy time, the union of every span in which an
  engine had requests or episodes (generating, or all its episodes waiting on their tools). Engines get the next
  step's batch before this one's last episodes are back (``algo.async_steps``), so batches overlap; a second in
  which two do counts once.
- ``engine_idle_on_env``: the share of that time in which every episode an engine had waited on its tool.
- ``run_tokens_per_s``: the policy's tokens over the wall time of the steps that had a batch generating behind
  them (all but the last ``algo.async_steps``).
- ``median``/``per_step``: each step's own batch: tokens over its busiest engine's span, the balancer's idle share.

``--from-runs`` runs nothing and summarizes the run folders an earlier run of this script left in OUT.
OUT/tool_latency.json is rewritten after every side; each side's metrics.jsonl stays in OUT/<side>.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = "slow_tool:SlowToolEnv"


def side_overrides(side: str, tokens: int, turns: int) -> list[str]:
    if side == "single":
        return ["task=arith", f"algo.max_new_tokens={tokens}"]
    per_turn = max(1, tokens // turns)
    latency = [] if side == "tool" else ["++task.env_args.min_ms=0", "++task.env_args.max_ms=0"]
    return ["task=env", f"task.env={ENV}", f"++task.env_args.turns={turns}", *latency, f"task.max_turns={turns}",
            f"algo.max_new_tokens={per_turn}", f"task.max_total_tokens={per_turn * turns + 96 * (turns - 1)}",
            "task.max_prompt_tokens=64"]


def engine_seconds(record: dict) -> tuple[float, float]:
    """The engines' generate and environment-wait seconds in a step (the busiest engine)."""
    per: dict[str, list[float]] = {}
    for s in record.get("timeline", []):
        if s["actor"].startswith("engine") and s["phase"] in ("generate", "env"):
            got = per.setdefault(s["actor"], [0.0, 0.0])
            got[s["phase"] == "env"] += s["end"] - s["start"]
    return max(per.values(), key=sum, default=[0.0, 0.0])


def same_async_steps(overrides: list[str], tokens: int, turns: int) -> list[str]:
    """overrides, with the tool side's algo.async_steps (the plan's for a multi-turn task, unless given) for
    every side, so the single-turn side runs as far ahead as the episodes do."""
    if any(o.startswith("algo.async_steps=") for o in overrides):
        return overrides
    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan

    sys.path.insert(0, str(HERE / "envs"))
    cfg = compose_run_config([*side_overrides("tool", tokens, turns), *overrides])
    return [*overrides, f"algo.async_steps={build_plan(cfg).async_steps}"]


def union_s(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by any of the spans (overlaps counted once)."""
    total, cur = 0.0, None
    for a, b in sorted(spans):
        if cur is None or a > cur[1]:
            total += (cur[1] - cur[0]) if cur else 0.0
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    return total + ((cur[1] - cur[0]) if cur else 0.0)


def summarize(run: Path, overrides: list[str] = ()) -> dict:
    """A side's steps after the first two: per step (its batch), and over them all: the engines' rate over the
    union of their busy spans, and the run's over the wall time of the steps that had a batch generating behind
    them (not the last ``algo.async_steps``)."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    use = records[2:] if len(records) > 3 else records[1:] or records
    plan = json.loads((run / "plan.json").read_text()) if (run / "plan.json").exists() else {}
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("algo.async_steps=")]
    ahead = int(plan["async_steps"] if "async_steps" in plan else given[-1] if given else 0)
    steady = use[: len(use) - ahead] if len(use) > ahead else use
    rows = []
    for r in use:
        gen_s, env_s = engine_seconds(r)
        busy = gen_s + env_s
        rows.append({"tokens": r["response_tokens"], "tokens_per_s": r["response_tokens"] / busy if busy else 0.0,
                     "generate_s": gen_s, "env_wait_s": env_s, "engine_idle_on_env": env_s / busy if busy else 0.0,
                     "balance_engine_idle_frac": float((r.get("balance") or {}).get("engine_idle_frac", 0.0)),
                     "step_s": r["step_s"], "turns": r.get("env/turns", 1.0), "env_tokens": r.get("env/tokens", 0.0),
                     "env_errors": r.get("env/errors", 0.0)})
    med = {k: statistics.median(x[k] for x in rows) for k in rows[0]} if rows else {}
    busy = union_s([(s["start"], s["end"]) for r in use for s in r.get("timeline", [])
                    if s["actor"].startswith("engine") and s["phase"] in ("generate", "env")])
    waited = sum(x["env_wait_s"] for x in rows)
    wall = sum(r["step_s"] for r in steady)
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    return {"steps_used": [r["step"] for r in use], "median": med, "per_step": rows, "async_steps": ahead,
            "engine_busy_s": busy, "engine_tokens_per_s": sum(r["response_tokens"] for r in use) / busy if busy else 0.0,
            "engine_idle_on_env": waited / busy if busy else 0.0,
            "run_steps": [r["step"] for r in steady],
            "run_tokens_per_s": sum(r["response_tokens"] for r in steady) / wall if wall else 0.0,
            "gpu_busy_pct": summary.get("gpu_busy_pct"), "summary_keys": sorted(summary)}


def compare(result: dict, side: str) -> None:
    """The side's rates as shares of the single-turn side's (when both are in)."""
    rec, base = result["sides"][side], result["sides"].get("single", {})
    if side == "single" or not rec.get("median") or not base.get("median"):
        return
    for key in ("engine_tokens_per_s", "run_tokens_per_s"):
        rec[f"{key}_vs_single"] = rec[key] / base[key] if base[key] else 0.0
    rec["tokens_per_s_vs_single"] = rec["median"]["tokens_per_s"] / base["median"]["tokens_per_s"]


def say(side: str, rec: dict) -> None:
    print(f"[tool_latency] {side}: rc {rec['rc']}, engines {rec.get('engine_tokens_per_s', 0):,.0f} tok/s (vs single "
          f"{rec.get('engine_tokens_per_s_vs_single', 1.0):.3f}), idle on tools {rec.get('engine_idle_on_env', 0):.1%}; "
          f"run {rec.get('run_tokens_per_s', 0):,.0f} tok/s (vs single {rec.get('run_tokens_per_s_vs_single', 1.0):.3f}); "
          f"per batch vs single {rec.get('tokens_per_s_vs_single', 1.0):.3f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512, help="the policy's tokens per episode, over all its turns")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--sides", default="single,turns,tool")
    ap.add_argument("--stop-ids", type=int, default=0,
                    help="K token ids (1000 ..) that end a turn, on every side: a random-init model then stops at a "
                         "random point (K/vocab a token), so turns have RL-shaped lengths rather than all the same")
    ap.add_argument("--from-runs", action="store_true",
                    help="run nothing: summarize the sides' run folders already in OUT (as a run of this script left them)")
    ap.add_argument("overrides", nargs="*")
    args, extra = ap.parse_known_args()
    args.overrides += extra
    if not args.from_runs:
        args.overrides = same_async_steps(args.overrides, args.tokens, args.turns)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE / "envs"), env.get("PYTHONPATH", "")) if p)
    result: dict = {"command": " ".join(sys.argv), "sides": {}}
    for side in args.sides.split(","):
        run = out / side
        stops = [f"task.stop_token_ids=[{','.join(str(1000 + k) for k in range(args.stop_ids))}]"] if args.stop_ids else []
        cmd = [sys.executable, "-m", "rlgen.cli", "train", "progress=false", f"hydra.run.dir={run}",
               f"steps={args.steps}", *side_overrides(side, args.tokens, args.turns), *stops, *args.overrides]
        t0 = time.time()
        if args.from_runs:
            rc = 0 if (run / "metrics.jsonl").exists() else 1
        else:
            with open(out / f"{side}.log", "w") as log:
                rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        rec = {"rc": rc, "wall_s": time.time() - t0, "command": " ".join(c if not c.startswith("task.stop_token_ids")
                                                                    else f"task.stop_token_ids=<{args.stop_ids} ids>"
                                                                    for c in cmd[2:])}
        if rc == 0:
            rec.update(summarize(run, args.overrides))
        for folder in ("final_model", "checkpoints"):  # the weights: not part of the result
            shutil.rmtree(run / folder, ignore_errors=True)
        result["sides"][side] = rec
        for name in result["sides"]:
            compare(result, name)
        (out / "tool_latency.json").write_text(json.dumps(result, indent=2) + "\n")
        say(side, rec)
    return 0 if all(s["rc"] == 0 for s in result["sides"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
