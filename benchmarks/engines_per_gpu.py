"""Several vLLM engines on one GPU against one, and against raw ``vllm.LLM``, on the `rlgen bench` workload.

    python benchmarks/engines_per_gpu.py OUT.json [--raw] --per-gpu 1,2 [--repeats 2] [hydra overrides ...]

vLLM's decode step is bound by its engine core's CPU work at small models (the GPU sits idle much of the
step), so engines that each have their own engine-core process can share one GPU and keep it busier. For
each k this runs `rlgen bench`'s vllm side with ``bench.engines_per_gpu=k``: k VLLMEngine actors with 1/k of
the GPU and of the memory share start one after another, get the prompts dealt round-robin and generate at
once. ``--raw`` first runs plain ``vllm.LLM`` with its defaults, as `rlgen bench` does. Every run records the
GPU's busy percentage (nvidia-smi's utilization.gpu during the calls). The JSON is rewritten after every point.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--per-gpu", default="1,2", help="comma-separated engine counts per GPU")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--raw", action="store_true", help="also vllm.LLM with its defaults (one engine), for the ratio")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    import ray

    from rlgen.bench import make_workload, run_raw_side, run_vllm_side, workload_summary
    from rlgen.bench.gpu import BusySampler, MemorySampler, gpu_info, versions
    from rlgen.bench.run import _build_model, compose, engine_env
    from rlgen.bench.sides import _env_vars
    from rlgen.charvocab import CHAR_VOCAB_SIZE

    cfg = compose(["engine=vllm", "model=qwen2_5_1_5b", *args.overrides])
    requests = make_workload(cfg.bench, cfg.model.vocab_size or CHAR_VOCAB_SIZE)
    out = Path(args.out)
    result = {"command": " ".join(sys.argv), "machine": gpu_info(), "versions": versions(),
              "workload": workload_summary(requests), "points": {}}
    ray.init(address="local", include_dashboard=False, runtime_env={"env_vars": _env_vars()})
    mem, busy = MemorySampler(), BusySampler()
    try:
        model_path = _build_model(cfg)
        points = (["raw"] if args.raw else []) + [int(x) for x in args.per_gpu.split(",") if x]
        for k in points:
            if k == "raw":
                rec = run_raw_side(model_path, requests, mem, seed=cfg.seed, busy_gpu=busy,
                                   logprobs_variants=(0,) * max(1, args.repeats))
            else:
                rec = run_vllm_side(model_path, cfg.engine, requests, mem, env=engine_env(cfg), seed=cfg.seed,
                                    repeats=args.repeats, per_gpu=k, busy_gpu=busy, label=f"vllm_x{k}")
            result["points"][str(k)] = rec
            out.write_text(json.dumps(result, indent=2) + "\n")
            runs = rec.get("runs") or [rec]
            print(f"[per_gpu] {k}: tokens/s {[r.get('tokens_per_s') for r in runs]}, GPU busy "
                  f"{[r.get('gpu_busy_pct') for r in runs]} %, start {rec.get('start_s')} s {rec.get('error', '')}",
                  flush=True)
    finally:
        mem.close()
        busy.close()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    sys.exit(main())
