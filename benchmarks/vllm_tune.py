"""Sweep vLLM settings of rlgen's VLLMEngine on the `rlgen bench` workload, one Ray actor (one GPU) per point.

    python benchmarks/vllm_tune.py --out tune.json --points seqs1024,seqs2048 [hydra overrides ...]

Each point starts a fresh engine with EngineConfig fields and/or extra vLLM engine arguments changed, runs the
bench workload once and records tokens/s (driver wall clock), engine start time and peak GPU memory. Points
named raw_* run plain ``vllm.LLM`` instead. Results are appended to the JSON file after every point.
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
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    names = [p for p in args.points.split(",") if p]
    unknown = [p for p in names if p not in POINTS]
    if unknown:
        ap.error(f"unknown points {unknown}")

    import ray

    from rlgen.bench import (
        MemorySampler,
        _build_model,
        _env_vars,
        compose,
        engine_env,
        gpu_info,
        make_workload,
        run_raw_side,
        run_vllm_side,
        versions,
        workload_summary,
    )
    from rlgen.charvocab import CHAR_VOCAB_SIZE

    cfg = compose(["engine=vllm", "model=qwen2_5_1_5b", *args.overrides])
    requests = make_workload(cfg.bench, cfg.model.vocab_size or CHAR_VOCAB_SIZE)
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
                rec = run_raw_side(model_path, requests, mem, seed=cfg.seed, logprobs_variants=(0, None))
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
