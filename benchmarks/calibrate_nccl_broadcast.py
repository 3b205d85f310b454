"""Planner calibration: NCCL broadcast of a Qwen2.5-0.5B-shaped bf16 tensor list between two GPUs, one
tensor at a time and as one flat buffer. Run on a 2-GPU host (writes $OUT/bcast.json when OUT is set):

    torchrun --nproc-per-node 2 benchmarks/calibrate_nccl_broadcast.py
"""

import json
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
r = dist.get_rank()
torch.cuda.set_device(r)
out = {}
# Qwen2.5-0.5B-like tensor list: 24 layers x 12 tensors + embedding, bf16 (~0.99 GB)
h, i, kv, L, V = 896, 4864, 128, 24, 151936
shapes = [(V, h)] + [
    s
    for _ in range(L)
    for s in [(h, h), (h,), (kv, h), (kv,), (kv, h), (kv,), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]
]
ts = [torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
nbytes = sum(t.numel() * 2 for t in ts)
flat = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16)
for name, fn in [
    ("per_tensor", lambda: [dist.broadcast(t, 0) for t in ts]),
    ("flat", lambda: dist.broadcast(flat, 0)),
]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 10
    out[name] = dict(
        bytes=nbytes, s=dt, gbps=nbytes / dt / 1e9, tensors=len(ts) if name == "per_tensor" else 1
    )
if r == 0:
    out["gpu"] = torch.cuda.get_device_name()
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    print(json.dumps(out, indent=1))
    open(os.environ.get("OUT", ".") + "/bcast.json", "w").write(json.dumps(out, indent=1))
dist.destroy_process_group()
