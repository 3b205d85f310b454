"""The DeepSpeed learner's train step alone, on synthetic rollouts: its speed in packed micro-batches of a token
budget, at fixed or RL-shaped lengths, with or without gradient checkpointing, and (with --profile) where one
step's time goes. Run on a GPU host, one process per rank set:

    python benchmarks/learner_speed.py --variants plan:ckpt --lengths rl,fixed --out learner.json
    python benchmarks/learner_speed.py --variants t16384:ckpt,t65536:ckpt --lengths rl
    # several ranks, one process each (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, one GPU per process):
    python benchmarks/learner_speed.py --variants plan:ckpt --world-size 4 --rank $R --master-port 29611 ...

Each variant builds a fresh learner on the model preset (random weights) with micro-batches of at most its token
budget (``plan``: the budget `rlgen plan` derives for the model on one H200; ``t<N>``: N tokens), runs --warmup
steps, then times --steps steps of --rows sequences: a left-padded prompt of up to --prompt tokens and a response
of --resp tokens (``fixed``) or of geometric length with mean --mean cut at --resp (``rl``). It prints and writes
one JSON record per variant and lengths: seconds per step, real tokens per second, the effective MFU (6 x
parameters x real tokens, the planner's count) and the peak memory. A DeepSpeed engine does not give all its
GPU memory back when it is freed, so a variant's peak is its own only in a process of its own: where peaks
matter, run one variant a process (benchmarks/gpu_session.sh learner-long does).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time

import torch

from rlgen.config.compose import compose_run_config
from rlgen.learners.deepspeed import DeepSpeedLearner
from rlgen.models.build import prepare_model
from rlgen.plan import build_plan
from rlgen.plan.memory import learner_memory
from rlgen.types import RolloutBatch


def response_lengths(rows: int, resp: int, lengths: str, mean: int, seed: int) -> list[int]:
    """fixed: every response resp tokens; rl: geometric lengths of this mean (at least 1), cut at resp."""
    if lengths == "fixed":
        return [resp] * rows
    rng = random.Random(seed)
    return [min(resp, 1 + int(rng.expovariate(1 / mean))) for _ in range(rows)]


def synthetic_batch(rows: int, prompt: int, resp_lens: list[int], vocab: int, seed: int) -> RolloutBatch:
    """rows sequences: prompts left-padded by 0-16 tokens, responses right-padded to the longest, advantages of
    both signs."""
    g = torch.Generator().manual_seed(seed)
    resp = max(resp_lens)
    ids = torch.randint(3, vocab, (rows, prompt + resp), generator=g)
    attn, mask = torch.zeros_like(ids), torch.zeros(rows, resp)
    pads = torch.randint(0, 17, (rows,), generator=g)
    for r, (pad, length) in enumerate(zip(pads.tolist(), resp_lens)):
        attn[r, pad: prompt + length], mask[r, :length] = 1, 1.0
        ids[r, :pad], ids[r, prompt + length:] = 0, 0
    adv = torch.randn(rows, generator=g)
    return RolloutBatch(
        input_ids=ids, attention_mask=attn, response_mask=mask,
        engine_logprobs=-torch.rand(rows, resp, generator=g) * 5 * mask, rewards=adv.clone(), advantages=adv,
        group_ids=torch.arange(rows) // 8, version=0, prompt_len=prompt,
    )


def parse_variant(text: str) -> tuple[str, bool, list[str]]:
    """'plan:ckpt' -> ('plan', True, []); 't16384:nockpt' -> ('t16384', False, []); 't131072:ckpt:tiled:offload'
    -> (..., ['learner.tiled_mlp=true', 'learner.offload_checkpoints=true']); untold, the plan decides those."""
    budget, ckpt, *extra = text.split(":")
    names = {"tiled": "learner.tiled_mlp", "offload": "learner.offload_checkpoints"}
    return budget, ckpt == "ckpt", [f"{names[e.removeprefix('no')]}={str(not e.startswith('no')).lower()}"
                                    for e in extra]


def planned(args, ckpt: bool, tokens: int | None = None, extra: list[str] | None = None):
    """The plan of `rlgen plan` for this model and these lengths on one H200 (its micro-batch budget derived, or
    tokens): the learner's config (YaRN where the lengths pass the model's positions) and its memory model."""
    overrides = [f"model={args.model}", "engine=vllm", "hardware=1xh200", f"algo.max_new_tokens={args.resp}",
                 f"task.max_prompt_tokens={args.prompt}", "algo.async_steps=1", "algo.lr=1e-6",
                 f"learner.gradient_checkpointing={str(ckpt).lower()}"]
    if tokens:
        overrides.append(f"algo.micro_batch_tokens={tokens}")
    return build_plan(compose_run_config(overrides + list(extra or [])))


def run_variant(args, budget: str, ckpt: bool, lengths: str, extra: list[str] | None = None) -> dict:
    plan = planned(args, ckpt, None if budget == "plan" else int(budget.removeprefix("t")), extra)
    cfg = plan.config
    tokens_budget = int(cfg.algo.micro_batch_tokens)
    alone = learner_memory(cfg, plan.model.params, plan.model.vocab_size, args.world_size, tokens_budget)
    path = prepare_model(cfg, "cuda")
    learner = DeepSpeedLearner(
        path, cfg.algo, cfg.monitor, rank=args.rank, world_size=args.world_size, gradient_checkpointing=ckpt,
        master_addr=args.master_addr if args.world_size > 1 else None,
        master_port=args.master_port if args.world_size > 1 else None, attention=args.attention,
        tiled_mlp=bool(cfg.learner.tiled_mlp), offload_checkpoints=bool(cfg.learner.offload_checkpoints),
    )
    params = sum(p.numel() for p in learner.module.parameters())
    vocab = learner.module.config.vocab_size
    lens = response_lengths(args.rows, args.resp, lengths, args.mean, seed=args.rank)
    batch = synthetic_batch(args.rows, args.prompt, lens, vocab, seed=args.rank)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        out = learner.train_step(batch)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        out = learner.train_step(batch)
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / args.steps
    free, total = torch.cuda.mem_get_info()  # the device's own count: the CUDA context and the allocator's cache too
    tokens = int(batch.attention_mask.sum())
    record = {
        "variant": f"{budget}:{'ckpt' if ckpt else 'nockpt'}", "lengths": lengths, "micro_batch_tokens": tokens_budget,
        "micro_batches": out.metrics["micro_batches"], "world_size": args.world_size, "rank": args.rank, "rows": args.rows,
        "tokens_per_step": tokens, "padded_tokens_per_step": int(batch.attention_mask.numel()),
        "step_s": round(step_s, 3), "tokens_per_s": round(tokens / step_s),
        "mfu_6pt": round(6 * params * tokens / step_s / args.peak_tflops / 1e12, 4),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1), "params": params,
        "reserved_peak_gib": round(torch.cuda.max_memory_reserved() / 2**30, 1),  # the allocator's, slack included
        "device_used_gib": round((total - free) / 2**30, 1),  # what the GPU holds for this process after the steps
        "attention": args.attention, "yarn_factor": cfg.model.yarn_factor, "tiled_mlp": cfg.learner.tiled_mlp,
        "offload_checkpoints": cfg.learner.offload_checkpoints,
        # the plan's memory model of this rank alone (no engine's IPC buffer beside it), against the measured peak
        "plan_peak_gib": round(alone.peak, 1), "plan_parts": alone.parts(),
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
    ap.add_argument("--variants", default="plan:ckpt")
    ap.add_argument("--lengths", default="rl,fixed", help="comma-separated: rl (geometric, mean --mean), fixed")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--resp", type=int, default=2048, help="the response cap (fixed: every response's length)")
    ap.add_argument("--mean", type=int, default=256, help="rl: the responses' mean length before the cap")
    ap.add_argument("--attention", default="torch_varlen", help="learner.attention")
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
        budget, ckpt, extra = parse_variant(text)
        for lengths in args.lengths.split(","):
            try:
                record = run_variant(args, budget, ckpt, lengths, extra)
            except torch.OutOfMemoryError as err:
                record = {"variant": text, "lengths": lengths, "error": f"out of memory: {str(err)[:200]}"}
                gc.collect()
                torch.cuda.empty_cache()
            print(json.dumps(record), flush=True)
            records.append(record)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
