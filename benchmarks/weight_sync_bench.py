"""Weight-sync benchmark: one full push of a model preset's weights into a running VLLMEngine, through the
transport a plan picks, timed from the driver, over several packed-buffer sizes.

    python benchmarks/weight_sync_bench.py --hardware 2xh200 --model qwen2_5_1_5b --out sync_nccl.json
    python benchmarks/weight_sync_bench.py --hardware 1xh100 --model qwen2_5_1_5b --out sync_ipc.json

hardware 2xh200 -> NCCL (engine GPU 0, learner GPU 1); 1xh100 -> CUDA IPC (one GPU, engine sleeps between
pushes as in a run). The learner here is a stand-in holding the bf16 model on its GPU, so the numbers are
the transfer alone: no ZeRO-3 gather (the GPU tests time that). Compare GB/s with
benchmarks/calibrate_nccl_broadcast.py (raw NCCL between the same GPUs) and with the old object-store path
(docs/benchmarks.md: 15.8 s from the driver for the 1.5B model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


class StaticLearner:
    """WeightSender over one bf16 model on this actor's GPU; bump() stands in for an optimizer step."""

    def __init__(self, path: str):
        import torch
        from transformers import AutoModelForCausalLM

        self.device, self.name, self.version = torch.device("cuda", 0), "learner0", 0
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(self.device)

    def bump(self) -> int:
        self.version += 1
        return self.version


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default="2xh200")
    ap.add_argument("--model", default="qwen2_5_1_5b")
    ap.add_argument("--bucket-mb", default="256,1024")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sleep-level", type=int, default=1)
    ap.add_argument("--out", default="weight_sync.json")
    ap.add_argument("--graphs", action="store_true", help="capture CUDA graphs (slower start, same transfer)")
    args = ap.parse_args()

    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rlgen.config.compose import compose_run_config
    from rlgen.engines.vllm.args import engine_args_for
    from rlgen.engines.vllm.engine import VLLMEngine
    from rlgen.models import prepare_model
    from rlgen.plan import Transport, build_plan
    from rlgen.runtime.start.transport import make_transport
    from rlgen.sync.sender import WeightSender

    overrides = ["engine=vllm", f"hardware={args.hardware}", f"model={args.model}", "engine.max_model_len=1024",
                 f"engine.enforce_eager={not args.graphs}"]
    colocated = args.hardware.startswith("1x")
    if colocated:
        overrides.append("engine.gpu_memory_utilization=0.4")
    cfg = compose_run_config(overrides)
    plan = build_plan(cfg)
    path = prepare_model(cfg, device="cuda")
    env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "PYTHONPATH", "NCCL_"))}
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("NCCL_CUMEM_ENABLE", "0")  # as in conf/engine/vllm.yaml, for the learner side too
    ray.init(address="local", include_dashboard=False, runtime_env={"env_vars": env})
    opts: dict = {}
    if colocated:
        pg = placement_group([{"CPU": 2, "GPU": 1}], strategy="STRICT_PACK")
        ray.get(pg.ready(), timeout=300)
        opts = {"scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)}
    share = 0.5 if colocated else 1
    learner_cls = type("BenchLearner", (WeightSender, StaticLearner), {})
    results = {"hardware": args.hardware, "model": args.model, "transport": plan.transport.value, "runs": []}
    for bucket_mb in [float(b) for b in args.bucket_mb.split(",")]:
        engine = ray.remote(VLLMEngine).options(num_gpus=share, max_concurrency=4, **opts).remote(
            path, cfg.engine, name="engine0", engine_args=engine_args_for(plan.transport))
        learner = ray.remote(learner_cls).options(num_gpus=share, num_cpus=1, **opts).remote(path)
        transport = make_transport(plan, cfg, bucket_mb=bucket_mb, sleep_level=args.sleep_level)
        t0 = time.time()
        transport.setup(learner, [engine], ["engine0"])
        setup_s = time.time() - t0
        total = ray.get(learner.weight_meta.remote(str(cfg.engine.dtype)))["total_bytes"]
        times = []
        for _ in range(args.repeats):
            version = ray.get(learner.bump.remote())
            if plan.transport is Transport.cuda_ipc:
                transport.sleep_engines()
            times.append(transport.push(version).seconds)
        run = {"bucket_mb": bucket_mb, "bytes": total, "setup_s": setup_s, "push_s": times,
               "median_s": statistics.median(times), "gb_per_s": total / statistics.median(times) / 1e9}
        print(json.dumps(run))
        results["runs"].append(run)
        for actor in (engine, learner):
            ray.kill(actor)
        time.sleep(5)  # let the GPU memory go before the next engine starts
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
