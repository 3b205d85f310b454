"""Several vLLM engines on one GPU against one, and against raw ``vllm.LLM``, on the `rlgen bench` workload.

    python benchmarks/engines_per_gpu.py OUT.json [--raw] --per-gpu 1,2 [--repeats 2] [hydra overrides ...]

vLLM's decode step is bound by its engine core's CPU work at small models (the GPU sits idle much of the
step), so engines that each have their own engine-core process can share one GPU and keep it busier. For
each k, k VLLMEngine actors with 1/k of the GPU and 1/k of the memory share (engine.gpu_memory_utilization,
0.9 when unset) start one after another (vLLM measures free memory as it starts), then get the workload's
prompts dealt round-robin and generate at once; a run's wall time is the slowest engine's. ``--raw`` first
runs plain ``vllm.LLM`` with its defaults, as `rlgen bench` does. GPU utilisation is nvidia-smi's
utilization.gpu sampled every 100 ms during the runs. The JSON is rewritten after every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


class UtilSampler:
    """nvidia-smi utilization.gpu every 100 ms while running."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE, text=True)
        self.on = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if self.on:
                try:
                    self.samples.append(float(line.split()[0]))
                except (ValueError, IndexError):
                    pass

    def window(self) -> list[float]:
        out, self.samples = self.samples, []
        return out

    def close(self) -> None:
        self.proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--per-gpu", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--raw", action="store_true", help="also vllm.LLM with its defaults (one engine), for the ratio")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    import ray

    from rlgen.bench.run import _build_model, compose, engine_env
    from rlgen.bench.sides import _env_vars
    from rlgen.bench.workload import check_completions, make_workload, workload_summary
    from rlgen.charvocab import CHAR_VOCAB_SIZE
    from rlgen.engines.vllm import VLLMEngine

    cfg = compose(["engine=vllm", "model=qwen2_5_1_5b", *args.overrides])
    requests = make_workload(cfg.bench, cfg.model.vocab_size or CHAR_VOCAB_SIZE)
    result = {"command": " ".join(sys.argv), "workload": workload_summary(requests), "points": {}}
    ray.init(address="local", include_dashboard=False, runtime_env={"env_vars": _env_vars()})
    util = UtilSampler()
    try:
        model_path = _build_model(cfg)
        base_share = cfg.engine.gpu_memory_utilization or 0.9
        if args.raw:
            from rlgen.bench.gpu import MemorySampler
            from rlgen.bench.sides import run_raw_side

            mem = MemorySampler()
            util.window()
            util.on = True
            result["points"]["raw"] = run_raw_side(model_path, requests, mem, seed=cfg.seed,
                                                   logprobs_variants=(0,) * args.repeats)
            util.on = False
            result["points"]["raw"]["gpu_util_mean_all_runs"] = round(sum(u := util.window()) / max(len(u), 1), 1)
            mem.close()
            print(f"[per_gpu] raw: {result['points']['raw'].get('runs')}", flush=True)
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        for k in [int(x) for x in args.per_gpu.split(",")]:
            engine = dataclasses.replace(cfg.engine, gpu_memory_utilization=round(base_share / k, 3))
            rec: dict = {"engines": k, "share_each": engine.gpu_memory_utilization}
            actors = []
            try:
                t0 = time.time()
                for i in range(k):
                    a = ray.remote(VLLMEngine).options(
                        num_gpus=1.0 / k, max_concurrency=4,
                        runtime_env={"env_vars": _env_vars(engine_env(cfg))},
                    ).remote(model_path, engine, device="cuda", seed=i, name=f"e{k}_{i}", env=engine_env(cfg))
                    ray.get(a.health.remote(), timeout=900)
                    actors.append(a)
                rec["start_s"] = round(time.time() - t0, 1)
                shards = [requests[i::k] for i in range(k)]
                runs = []
                for _ in range(args.repeats):
                    util.window()
                    util.on = True
                    t1 = time.time()
                    outs = ray.get([a.generate.remote(s) for a, s in zip(actors, shards)], timeout=1800)
                    wall = time.time() - t1
                    util.on = False
                    u = util.window()
                    toks, ok = 0, True
                    for s, o in zip(shards, outs):
                        chk = check_completions(s, o["completions"])
                        toks += chk["tokens"]
                        ok = ok and chk["n_ok"] and chk["lengths_ok"] and chk["logprobs_ok"]
                    runs.append({"wall_s": round(wall, 2), "tokens": toks, "tokens_per_s": round(toks / wall, 1),
                                 "checks_ok": ok, "gpu_util_mean": round(sum(u) / max(len(u), 1), 1)})
                    print(f"[per_gpu] k={k}: {runs[-1]}", flush=True)
                    rec["runs"] = runs
                    result["points"][str(k)] = rec
                    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
                rec["runs"] = runs
                rec["best_tokens_per_s"] = max(r["tokens_per_s"] for r in runs)
            except Exception as err:  # noqa: BLE001
                rec["error"] = f"{type(err).__name__}: {err}"[-2000:]
                print(f"[per_gpu] k={k}: {rec['error']}", flush=True)
            for a in actors:
                try:
                    ray.get(a.shutdown.remote(), timeout=120)
                except Exception:  # noqa: BLE001
                    pass
                ray.kill(a)
            time.sleep(5)
            result["points"][str(k)] = rec
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        util.close()
        ray.shutdown()
    for k, rec in result["points"].items():
        print(f"[per_gpu] per_gpu={k}: best {rec.get('best_tokens_per_s')} tok/s {rec.get('error', '')}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    sys.exit(main())
