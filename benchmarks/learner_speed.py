"""The DeepSpeed learner's train step alone, on synthetic rollouts: how its speed moves with the micro-batch and
gradient checkpointing, and (with --profile) where one step's time goes. Run on a GPU host, one process per
rank set:

    python benchmarks/learner_speed.py --variants mb8:ckpt,mb32:ckpt,mb16:nockpt --out learner.json
    # several ranks, one process each (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, one GPU per process):
    python benchmarks/learner_speed.py --variants mb8:ckpt --world-size 4 --rank $R --master-port 29611 ...

Each variant builds a fresh learner on the model preset (random weights), runs --warmup steps, then times
--steps steps of --rows sequences (a left-padded prompt of up to --prompt tokens and a --resp-token response).
It prints and writes one JSON record per variant: seconds per step, tokens per second, the effective MFU
(6 x parameters x tokens, the planner's count) and the peak memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch

from rlgen.config.compose import compose_run_config
from rlgen.learners.deepspeed import DeepSpeedLearner
from rlgen.models.build import prepare_model
from rlgen.types import RolloutBatch


def synthetic_batch(rows: int, prompt: int, resp: int, vocab: int, seed: int) -> RolloutBatch:
    """rows sequences: prompts left-padded by 0-16 tokens, full-length responses, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, prompt + resp), generator=g)
    attn = torch.ones_like(ids)
    pads = torch.randint(0, 17, (rows,), generator=g)
    for r, pad in enumerate(pads.tolist()):
        ids[r, :pad], attn[r, :pad] = 0, 0
    adv = torch.randn(rows, generator=g)
    return RolloutBatch(
        input_ids=ids, attention_mask=attn, response_mask=torch.ones(rows, resp),
        engine_logprobs=-torch.rand(rows, resp, generator=g) * 5, rewards=adv.clone(), advantages=adv,
        group_ids=torch.arange(rows) // 8, version=0, prompt_len=prompt,
    )


def parse_variant(text: str) -> tuple[int, bool]:
    """'mb32:ckpt' -> (32, True); 'mb16:nockpt' -> (16, False)."""
    micro, ckpt = text.split(":")
    return int(micro.removeprefix("mb")), ckpt == "ckpt"


def run_variant(args, micro: int, ckpt: bool) -> dict:
    cfg = compose_run_config([f"model={args.model}", f"algo.micro_batch_size={micro}", "hardware=1xh100",
                              "algo.lr=1e-6", "algo.max_new_tokens=256", "algo.async_steps=1"])
    path = prepare_model(cfg, "cuda")
    learner = DeepSpeedLearner(
        path, cfg.algo, cfg.monitor, rank=args.rank, world_size=args.world_size, gradient_checkpointing=ckpt,
        rows_per_step=args.rows, master_addr=args.master_addr if args.world_size > 1 else None,
        master_port=args.master_port if args.world_size > 1 else None,
    )
    params = sum(p.numel() for p in learner.module.parameters())
    vocab = learner.module.config.vocab_size
    batch = synthetic_batch(args.rows, args.prompt, args.resp, vocab, seed=args.rank)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        learner.train_step(batch)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        learner.train_step(batch)
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / args.steps
    tokens = int(batch.attention_mask.sum())
    record = {
        "variant": f"mb{micro}:{'ckpt' if ckpt else 'nockpt'}", "world_size": args.world_size, "rank": args.rank,
        "rows": args.rows, "tokens_per_step": tokens, "step_s": round(step_s, 3),
        "tokens_per_s": round(tokens / step_s), "mfu_6pt": round(6 * params * tokens / step_s / args.peak_tflops / 1e12, 4),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1), "params": params,
    }
    if args.profile:
        record["profile"] = profile_step(learner, batch)
    del learner
    gc.collect()
    torch.cuda.empty_cache()
    return record


def profile_step(learner, batch) -> dict:
    """One step under torch's profiler: GPU kernel time against the step's wall time, and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        learner.train_step(batch)
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    kernels = sorted((e for e in events if e.device_type.name == "CUDA"),
                     key=lambda e: e.self_device_time_total, reverse=True)
    gpu_s = sum(e.self_device_time_total for e in kernels) / 1e6
    top = [{"name": e.key[:90], "s": round(e.self_device_time_total / 1e6, 3), "calls": e.count} for e in kernels[:15]]
    cpu = sorted((e for e in events if e.device_type.name == "CPU"), key=lambda e: e.self_cpu_time_total, reverse=True)
    top_cpu = [{"name": e.key[:90], "s": round(e.self_cpu_time_total / 1e6, 3), "calls": e.count} for e in cpu[:12]]
    return {"wall_s": round(wall, 3), "gpu_kernel_s": round(gpu_s, 3), "kernels": top, "cpu_ops": top_cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2_5_1_5b")
    ap.add_argument("--variants", default="mb8:ckpt")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--resp", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--master-port", type=int, default=29611)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    records = []
    for text in args.variants.split(","):
        micro, ckpt = parse_variant(text)
        try:
            record = run_variant(args, micro, ckpt)
        except torch.OutOfMemoryError as err:
            record = {"variant": text, "error": f"out of memory: {str(err)[:200]}"}
            gc.collect()
            torch.cuda.empty_cache()
        print(json.dumps(record), flush=True)
        records.append(record)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
