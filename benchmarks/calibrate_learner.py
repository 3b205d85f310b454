# ruff: noqa: B023, F821  (the step closure runs inside its own loop iteration)
"""Planner calibration: bf16 forward+backward+AdamW throughput of random Qwen2.5 shapes on one GPU, and a
bf16 8192^3 matmul. Counts 6 * params * tokens per step. Run on a GPU host:

    python benchmarks/calibrate_learner.py
"""

import json
import os
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

shapes = {
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}
out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
for name, kw in shapes.items():
    cfg = Qwen2Config(vocab_size=151936, max_position_embeddings=4096, **kw)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().train()
    P = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-6, fused=True)
    for mb, T, L in [(8, 640, 512), (16, 640, 512)]:
        ids = torch.randint(0, 151936, (mb, T), device="cuda")

        def step():
            lg = m(input_ids=ids[:, :-1], logits_to_keep=L, use_cache=False).logits.float()
            lp = torch.log_softmax(lg, -1).gather(-1, ids[:, -L:].unsqueeze(-1)).mean()
            (-lp).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = 10
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / n
        toks = mb * T
        out[f"{name}_mb{mb}"] = dict(params=P, tokens=toks, step_s=dt, tflops_6PT=6 * P * toks / dt / 1e12)
        print(name, mb, out[f"{name}_mb{mb}"], flush=True)
    del m, opt
    torch.cuda.empty_cache()
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(10):
    a @ b
torch.cuda.synchronize()
out["matmul_tflops"] = 10 * 2 * 8192**3 / (time.perf_counter() - t0) / 1e12
x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(20):
    y.copy_(x)
torch.cuda.synchronize()
out["copy_tbps_rw"] = 20 * 2 * 2**30 / (time.perf_counter() - t0) / 1e12
print(json.dumps(out, indent=1))
open(os.environ.get("OUT", ".") + "/learn.json", "w").write(json.dumps(out, indent=1))
