"""Two processes on two GPUs join one NCCL group and broadcast, with NCCL_CUMEM_ENABLE set three ways: unset on
both, 0 on both, and unset on one side only (a trainer beside rlgen's vLLM engines, which run with 0).

    python benchmarks/nccl_cumem_check.py          # needs two CUDA GPUs; torch only

Prints one line per case: each rank's result ("ok" and the value it received, or NCCL's failure) and the seconds
the case took. A rank that never answers within 60 s is left out of its line.
"""

from __future__ import annotations

import os
import queue
import time

import torch.multiprocessing as mp

CASES = {
    "both unset": [{}, {}],
    "both 0": [{"NCCL_CUMEM_ENABLE": "0"}, {"NCCL_CUMEM_ENABLE": "0"}],
    "trainer unset, engine 0": [{}, {"NCCL_CUMEM_ENABLE": "0"}],
}


def _rank(rank: int, envs: list[dict], port: int, out) -> None:
    os.environ.update(envs[rank])
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    try:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                device_id=torch.device("cuda", rank))
        t = torch.full((1 << 20,), float(rank + 1), device="cuda")
        dist.broadcast(t, src=0)
        torch.cuda.synchronize()
        out.put((rank, "ok", float(t[0])))
        dist.destroy_process_group()
    except Exception as err:  # NCCL's own words are the result
        out.put((rank, "fail", str(err).strip().splitlines()[-1][:200]))


def main() -> None:
    ctx = mp.get_context("spawn")
    for i, (name, envs) in enumerate(CASES.items()):
        out = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(r, envs, 29600 + i, out)) for r in range(2)]
        for p in procs:
            p.start()
        got, t0 = [], time.time()
        while len(got) < 2 and time.time() - t0 < 60:
            try:
                got.append(out.get(timeout=5))
            except queue.Empty:
                pass
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        print(name, sorted(got), f"{time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
