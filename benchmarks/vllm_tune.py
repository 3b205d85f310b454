"""Sweep vLLM settings of rlgen's VLLMEngine on the `rlgen bench` workload, one Ray actor (one GPU) per point.

    python benchmarks/vllm_tune.py --out tune.json --points seqs1024,seqs2048 [--repeats N] [--seeded] [hydra overrides ...]

Each point starts a fresh engine with EngineConfig fields and/or extra vLLM engine arguments changed, runs the
bench workload once and records tokens/s (driver wall clock), engine start time and peak GPU memory. Points
named raw_* run plain ``vllm.LLM`` instead. ``--repeats`` runs the workload that many times on each engine (the
first call warms up; every call is kept); ``--seeded`` gives every request a seed, as training does. The
workload is the bench config's, so ``bench.*`` and ``model.*`` overrides give other shapes. Results are
appended to the JSON file after every point.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# name: (EngineConfig changes, extra vLLM engine args, options)
POINTS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    # vLLM's own AsyncEngineArgs default for the token budget per step (2048), rlgen's yaml otherwise
    "as_configured_mnbt2048": ({}, {"max_num_batched_tokens": None}, {}),
    "seqs256": ({"max_num_seqs": 256}, {}, {}),
    "seqs512": ({"max_num_seqs": 512}, {}, {}),
    "seqs1024": ({"max_num_seqs": 1024}, {}, {}),
    "seqs2048": ({"max_num_seqs": 2048}, {}, {"seeded_extra": True}),
    "seqs2048_eager": ({"max_num_seqs": 2048, "enforce_eager": True}, {}, {}),
    "seqs2048_graphs1024": ({"max_num_seqs": 2048}, {"max_cudagraph_capture_size": 1024}, {}),
    "seqs2048_mnbt8192": ({"max_num_seqs": 2048}, {"max_num_batched_tokens": 8192}, {}),
    "seqs2048_mnbt32768": ({"max_num_seqs": 2048}, {"max_num_batched_tokens": 32768}, {}),
    "seqs2048_nosleep": ({"max_num_seqs": 2048, "enable_sleep_mode": False}, {}, {}),
    "seqs1024_graphs1024": ({"max_num_seqs": 1024}, {"max_cudagraph_capture_size": 1024}, {}),
    "seqs2048_gpu095": ({"max_num_seqs": 2048, "gpu_memory_utilization": 0.95}, {}, {}),
    # plain vllm.LLM with defaults: with logprobs=0 and without logprobs, on one engine
    "raw_logprobs_cost": ({}, {}, {"raw": True}),
    # what one decode step costs at the small batches RL runs per engine (use with --repeats and a small
    # bench workload): rlgen's settings, then one thing changed at a time
    "as_configured": ({}, {}, {}),
    "sync_sched": ({}, {"async_scheduling": False}, {}),
    "noprefix": ({"enable_prefix_caching": False}, {}, {}),
    "nosleep": ({"enable_sleep_mode": False}, {}, {}),
    "raw_logprobs": ({}, {}, {"raw": True, "logprobs_only": True}),
    "raw_inprocess": ({}, {}, {"raw": True, "logprobs_only": True, "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}),
}


def seeded(requests: list, seed: int = 1234) -> list:
    """The same requests with a per-request seed, as the trainer sends them."""
    from rlgen.types import GenRequest

    return [
        GenRequest(r.prompt_ids, dataclasses.replace(r.sampling, seed=seed), r.group_id) for r in requests
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", required=True, help=f"comma-separated, from: {', '.join(POINTS)}")
    ap.add_argument("--repeats", type=int, default=1, help="generate calls per point (the first warms up)")
    ap.add_argument("--seeded", action="store_true", help="every request carries a seed, as in training")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    names = [p for p in args.points.split(",") if p]
    unknown = [p for p in names if p not in POINTS]
    if unknown:
        ap.error(f"unknown points {unknown}")

    import ray

    from rlgen.bench import make_workload, run_raw_side, run_vllm_side, workload_summary
    from rlgen.bench.gpu import MemorySampler, gpu_info, versions
    from rlgen.bench.run import _build_model, compose, engine_env
    from rlgen.bench.sides import _env_vars
    from rlgen.charvocab import CHAR_VOCAB_SIZE

    cfg = compose(["engine=vllm", "model=qwen2_5_1_5b", *args.overrides])
    requests = make_workload(cfg.bench, cfg.model.vocab_size or CHAR_VOCAB_SIZE)
    if args.seeded:
        requests = seeded(requests)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    result.update(
        {
            "command": " ".join(sys.argv),
            "machine": gpu_info(),
            "versions": versions(),
            "workload": workload_summary(requests),
            "base_engine": {k: getattr(v, "value", v) for k, v in dataclasses.asdict(cfg.engine).items()},
        }
    )
    result.setdefault("points", {})
    ray.init(
        address=os.environ.get("RAY_ADDRESS", "local"),
        include_dashboard=False,
        runtime_env={"env_vars": _env_vars()},
    )
    mem = MemorySampler()
    try:
        model_path = _build_model(cfg)
        for name in names:
            eng_changes, engine_args, opts = POINTS[name]
            t0 = time.time()
            if opts.get("raw"):
                variants = (0,) * max(1, args.repeats) + (() if opts.get("logprobs_only") else (None,))
                rec = run_raw_side(model_path, requests, mem, seed=cfg.seed, logprobs_variants=variants,
                                   llm_kwargs={"gpu_memory_utilization": cfg.engine.gpu_memory_utilization}
                                   if cfg.engine.gpu_memory_utilization else None, env=opts.get("env"))
            else:
                engine = dataclasses.replace(cfg.engine, **eng_changes)
                extra = {"seeded": seeded(requests)} if opts.get("seeded_extra") else None
                rec = run_vllm_side(
                    model_path,
                    engine,
                    requests,
                    mem,
                    env=engine_env(cfg),
                    engine_args=engine_args,
                    seed=cfg.seed,
                    extra=extra,
                    repeats=args.repeats,
                    label=name,
                )
                rec["engine_changes"] = eng_changes
            rec["point_s"] = round(time.time() - t0, 1)
            result["points"][name] = rec
            out.write_text(json.dumps(result, indent=2) + "\n")
            tps = rec.get("tokens_per_s", 0)
            print(
                f"[tune] {name}: {tps:,.0f} tok/s, start {rec.get('start_s', '-')} s, "
                f"peak {rec.get('peak_gpu_gib', '-')} GiB, {rec.get('error', 'ok')}",
                flush=True,
            )
    finally:
        mem.close()
        ray.shutdown()
    print("[tune] summary")
    for name, rec in result["points"].items():
        extra = {k: v.get("tokens_per_s") for k, v in rec.get("extra", {}).items()}
        nolp = rec.get("logprobs_None", {}).get("tokens_per_s")
        print(
            f"  {name:28s} {rec.get('tokens_per_s', 0):>10,.0f} tok/s  start {rec.get('start_s', '-'):>6} s"
            f"  {('extra ' + str(extra)) if extra else ''}{(' no-logprobs ' + str(nolp)) if nolp else ''}"
            f"  {rec.get('error', '')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
