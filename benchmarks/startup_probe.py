"""Where a vLLM engine's start-up and a rollout's decode time go, at the 0.5B one-liner's shape, on one GPU.

    python benchmarks/startup_probe.py OUT_DIR [--tokens 256] [--skip cold,warm,plan,pair]

Runs rlgen's VLLMEngine (in this process, as a Ray actor would) on a random qwen2_5_0_5b folder at the
one-liner's engine share (0.45), stage by stage, and writes OUT_DIR/probe.json after each stage:

- ``cold``: the first start on this host (empty vLLM compile cache), with vLLM's startup plan on
  (``VLLM_ENABLE_STARTUP_PLAN=1``, which records the profiled KV-cache size). Then two generations at the
  one-liner's batch (64 prompts x 8 samples, ``--tokens`` each, ``ignore_eos``): with per-request seeds, as a
  training run samples, and without.
- ``warm``: a second start, compile cache present, startup plan off (vLLM profiles memory again).
- ``plan``: a third start with the startup plan on, which skips that profiling.
- ``pair``: two engines as Ray actors sharing the GPU (0.225 each), started at the same time with an explicit
  ``kv_cache_memory_bytes`` taken from the recorded plan, then the seeded generation dealt between them.

Each record has the engine's start-up clock (``import vllm``, vLLM engine start and vLLM's own parts), tokens/s
and the GPU's busy %. With ``benchmarks/stack_sampler`` first on PYTHONPATH and RLGEN_STACK_SAMPLES=DIR, every
process also writes stack samples (``benchmarks/stack_summary.py`` reads them).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

SHARE = 0.45  # the one-liner's derived engine.gpu_memory_utilization on one H100 (`rlgen plan`)


def requests(n_prompts: int, n: int, tokens: int, seeded: bool, vocab: int) -> list[Any]:
    from rlgen.types import GenRequest, SamplingParams

    rng = random.Random(0)
    sp = SamplingParams(n=n, max_new_tokens=tokens, ignore_eos=True, seed=12345 if seeded else None)
    return [GenRequest(prompt_ids=tuple(rng.randrange(vocab) for _ in range(16)), sampling=sp, group_id=i)
            for i in range(n_prompts)]


def timed_generate(engines: list[Any], reqs: list[Any], busy: Any, remote: bool) -> dict[str, Any]:
    import ray

    parts = [reqs[i::len(engines)] for i in range(len(engines))]
    busy.start()
    t0 = time.time()
    if remote:
        outs = ray.get([e.generate.remote(p) for e, p in zip(engines, parts)], timeout=900)
    else:
        outs = [e.generate(p) for e, p in zip(engines, parts)]
    wall = time.time() - t0
    tokens = sum(len(c.token_ids) for o in outs for c in o.completions)
    return {"wall_s": round(wall, 2), "tokens": tokens, "tokens_per_s": round(tokens / wall), "gpu_busy_pct": busy.stop()}


def start_local(model: str, engine_cfg: Any, env: dict[str, str], extra_env: dict[str, str]) -> tuple[Any, dict]:
    from rlgen.engines.vllm.engine import VLLMEngine

    os.environ.update(extra_env)
    t0 = time.time()
    eng = VLLMEngine(model, engine_cfg, env=env)
    rec = {"start_s": round(time.time() - t0, 2), "startup": eng.clock.to_dict()}
    return eng, rec


def recorded_kv_bytes() -> int | None:
    root = os.environ.get("VLLM_CACHE_ROOT", os.path.expanduser("~/.cache/vllm"))
    plans = sorted(glob.glob(os.path.join(root, "startup_plan", "*.json")), key=os.path.getmtime)
    return int(json.loads(Path(plans[-1]).read_text())["kv_cache_memory_bytes"]) if plans else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--skip", default="")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    t_launch = time.time()
    from rlgen.bench.gpu import gpu_info, versions
    from rlgen.bench.run import compose, engine_env
    from rlgen.gpubusy import BusySampler
    from rlgen.models import prepare_model

    cfg = compose(["engine=vllm", "hardware=1xh100", "model=qwen2_5_0_5b"])
    engine_cfg = dataclasses.replace(cfg.engine, gpu_memory_utilization=SHARE)
    env = engine_env(cfg)
    result: dict[str, Any] = {"command": " ".join(sys.argv), "machine": gpu_info(), "versions": versions(),
                              "share": SHARE, "tokens": args.tokens, "stages": {}}

    def save() -> None:
        (out / "probe.json").write_text(json.dumps(result, indent=2) + "\n")

    t0 = time.time()
    model = prepare_model(cfg, "cuda")
    result["model_folder_s"] = round(time.time() - t0, 2)
    result["imports_s"] = round(t0 - t_launch, 2)
    vocab = cfg.model.vocab_size
    busy = BusySampler()
    seeded = requests(64, 8, args.tokens, True, vocab)
    unseeded = requests(64, 8, args.tokens, False, vocab)

    for stage, plan_env in (("cold", "1"), ("warm", "0"), ("plan", "1")):
        if stage in skip:
            continue
        print(f"[probe] {stage}: starting", flush=True)
        try:
            eng, rec = start_local(model, engine_cfg, env, {"VLLM_ENABLE_STARTUP_PLAN": plan_env})
            rec["t_ready"] = round(time.time() - t_launch, 2)
            if stage == "cold":
                rec["seeded"] = timed_generate([eng], seeded, busy, False)
                rec["unseeded"] = timed_generate([eng], unseeded, busy, False)
                rec["seeded_again"] = timed_generate([eng], seeded, busy, False)
            eng.shutdown()
        except Exception as err:  # keep going: the other stages still say something
            rec = {"error": f"{type(err).__name__}: {err}"[:2000]}
        rec["kv_cache_memory_bytes_recorded"] = recorded_kv_bytes()
        result["stages"][stage] = rec
        save()
        print(f"[probe] {stage}: {json.dumps(rec)[:1500]}", flush=True)
        time.sleep(5)

    if "pair" not in skip:
        import ray

        from rlgen.bench.sides import _env_vars
        from rlgen.engines.vllm.engine import VLLMEngine

        kv = recorded_kv_bytes()
        rec: dict[str, Any] = {"kv_full_bytes": kv}
        try:
            total = int(float(gpu_info().get("gpu_memory_gib", 79.6)) * 2**30)
            half = dataclasses.replace(engine_cfg, gpu_memory_utilization=SHARE / 2)
            kv_half = int(kv - SHARE / 2 * total) if kv else None
            rec["kv_half_bytes"] = kv_half
            ray.init(address="local", include_dashboard=False, runtime_env={"env_vars": _env_vars(env)})
            t0 = time.time()
            actors = [ray.remote(VLLMEngine).options(num_gpus=0.5, max_concurrency=4).remote(
                model, half, env=env, name=f"engine{i}",
                engine_args={"kv_cache_memory_bytes": kv_half} if kv_half else None) for i in range(2)]
            health = ray.get([a.health.remote() for a in actors], timeout=600)
            rec["start_both_s"] = round(time.time() - t0, 2)
            rec["startup"] = [h["startup"] for h in health]
            rec["seeded"] = timed_generate(actors, seeded, busy, True)
            rec["unseeded"] = timed_generate(actors, unseeded, busy, True)
            ray.get([a.shutdown.remote() for a in actors], timeout=120)
        except Exception as err:
            rec["error"] = f"{type(err).__name__}: {err}"[:2000]
        result["stages"]["pair"] = rec
        save()
        print(f"[probe] pair: {json.dumps(rec)[:1500]}", flush=True)
    busy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
