"""`rlgen serve` beside `rlgen train engine=remote`, timed, on a GPU host (or on CPU with the tiny default).

    python benchmarks/serve_remote.py OUT SERVER_OVERRIDES -- TRAIN_OVERRIDES
    python benchmarks/serve_remote.py /tmp/sr -- steps=20                                   # CPU, tiny
    python benchmarks/serve_remote.py /tmp/sr -- weights        # only time HTTP weight pushes of the served model
    python benchmarks/serve_remote.py --compare /tmp/sr -- steps=40  # and the same run with engines of its own
    python benchmarks/serve_remote.py --server-gpus 0 --train-gpus 1 --trainers 2 /tmp/sr engine=vllm ... -- \\
        engine.weights_over=nccl ...             # the server on GPU 0, two trainers on GPU 1, one after the other
    python benchmarks/serve_remote.py /tmp/sr engine=vllm hardware=1xh100 model=qwen2_5_0_5b \\
        engine.gpu_memory_utilization=0.35 engine.max_model_len=512 -- hardware=1xh100 model=qwen2_5_0_5b \\
        engine.weights_over=http steps=5 algo.max_new_tokens=256 ...

Starts the server (hydra.run.dir=OUT/serve) on a free loopback port and waits for /health; measures the
server's generation throughput through rlgen's client on an RL-shaped batch (prompts x n, lognormal response
lengths); runs the training job against it (OUT/run); stops the server with SIGINT; with --compare, runs the
same job with engines of its own (OUT/in_process) for a side-by-side ratio. Writes OUT/serve_remote.json:
server start-up, client tok/s, the run's exit code, median step, generation tok/s and per-engine sync time
(the whole HTTP or NCCL update, as the engine's proxy saw it), and the server's counters.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_throughput(url: str, vocab: int, max_len: int, prompts: int = 64, n: int = 8, median: int = 128,
                      seed: int = 0) -> dict:
    """prompts x n sequences of 64-token prompts (fewer for a short max_model_len) and lognormal lengths."""
    from rlgen.types import GenRequest, SamplingParams
    from rlgen.wire.client import GenerationClient

    rng = random.Random(seed)
    prompt_len = min(64, max_len // 4)
    cap = min(2 * median, max_len - prompt_len)
    median = min(median, cap)
    reqs = [GenRequest(tuple(rng.randrange(vocab // 2, vocab) for _ in range(prompt_len)),
                       SamplingParams(n=n, max_new_tokens=max(8, min(cap, int(rng.lognormvariate(0, 0.7) * median))),
                                      ignore_eos=True, seed=i), i) for i in range(prompts)]
    with GenerationClient(url) as client:
        client.generate(reqs[:2])  # warm-up
        t0 = time.time()
        out = client.generate(reqs)
        wall = time.time() - t0
    tokens = sum(len(c.token_ids) for c in out.completions)
    return {"sequences": len(out.completions), "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall}


def train_summary(run: Path) -> dict:
    """Medians over the steps after the first, from a run's metrics.jsonl."""
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    later = recs[1:] or recs
    syncs = [max((s["end"] - s["start"] for s in r["timeline"] if s["phase"] == "sync"
                  and s["actor"].startswith("engine")), default=0.0) for r in later]
    return {"steps": len(recs), "median_step_s": statistics.median(r["step_s"] for r in later),
            "median_generate_s": statistics.median(r["generate_s"] for r in later),
            "median_train_s": statistics.median(r["train_s"] for r in later),
            "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in later),
            "median_engine_sync_s": statistics.median(syncs),
            "reward_first_last": [recs[0]["reward_mean"], recs[-1]["reward_mean"]],
            "mismatch_k3_max": max(r.get("mismatch/k3_kl") or 0.0 for r in recs)}


def in_process(out: Path, server_over: list[str], train_over: list[str]) -> dict:
    """The same training job with engines of its own (the server's engine, model and hardware settings)."""
    own = [o for o in server_over if o.split("=", 1)[0].split(".")[0] in ("engine", "model", "hardware")]
    own = [o for o in own if not o.startswith("engine.max_model_len")]
    run = out / "in_process"
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "rlgen.cli", "train", "progress=false", f"hydra.run.dir={run}", *own,
                          *[o for o in train_over if not o.startswith("engine.weights_over")]],
                         capture_output=True, text=True, timeout=1800)
    summary = {"rc": res.returncode, "wall_s": time.time() - t0, "overrides": own}
    if (run / "metrics.jsonl").is_file():
        summary.update(train_summary(run))
    return summary


def start_server(out: Path, overrides: list[str], env: dict | None = None,
                 limit_s: float = 900.0) -> tuple[subprocess.Popen, str, dict | None, float]:
    """`rlgen serve` (hydra.run.dir=OUT/serve, its output in OUT/serve.out) on a free loopback port, waited for
    until healthy: the process, its URL, its /info (None when it never became healthy) and its start-up seconds."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    log = (out / "serve.out").open("w")
    server = subprocess.Popen([sys.executable, "-m", "rlgen.cli", "serve", f"serve.port={port}",
                               f"hydra.run.dir={out / 'serve'}", *overrides], stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True, env=env)
    from rlgen.wire.client import GenerationClient, ServerError

    while server.poll() is None and time.time() - t0 < limit_s:
        try:
            with GenerationClient(url, timeout_s=5) as c:
                if c.health()["ok"]:
                    return server, url, c.info(), time.time() - t0
        except ServerError:
            time.sleep(1)
    return server, url, None, time.time() - t0


def stop_server(server: subprocess.Popen) -> int | str:
    """SIGINT to the server's process group (a graceful stop), SIGKILL after 120 s; its exit code."""
    if server.poll() is not None:
        return server.returncode
    os.killpg(server.pid, signal.SIGINT)
    try:
        return server.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        return "killed"


def side_env(gpus: str | None) -> dict | None:
    """This process's environment with CUDA_VISIBLE_DEVICES=gpus (None: unchanged)."""
    return None if gpus is None else {**os.environ, "CUDA_VISIBLE_DEVICES": gpus}


def options(argv: list[str]) -> tuple[dict, list[str]]:
    """--compare, --trainers N, --server-gpus G, --train-gpus G (before OUT), and the rest."""
    opts: dict = {"compare": False, "trainers": 1, "server_gpus": None, "train_gpus": None}
    while argv and argv[0].startswith("--") and argv[0] != "--":
        flag, argv = argv[0][2:].replace("-", "_"), argv[1:]
        if flag == "compare":
            opts["compare"] = True
        else:
            opts[flag], argv = (int(argv[0]) if flag == "trainers" else argv[0]), argv[1:]
    return opts, argv


def main(argv: list[str]) -> int:
    opts, argv = options(argv)
    compare = opts["compare"]
    out = Path(argv[0])
    rest = argv[1:]
    split = rest.index("--") if "--" in rest else len(rest)
    server_over, train_over = rest[:split], rest[split + 1:]
    out.mkdir(parents=True, exist_ok=True)
    server, url, info, start_s = start_server(out, server_over, env=side_env(opts["server_gpus"]))
    result: dict = {"server_overrides": server_over, "train_overrides": train_over, "url": url}
    if info is None:
        stop_server(server)
        result["server_failed"] = (out / "serve.out").read_text()[-3000:]
        (out / "serve_remote.json").write_text(json.dumps(result, indent=2))
        return 1
    result["server_start_s"] = start_s
    result["server_info"] = info
    try:
        run_train(url, out, train_over, info, result, trainers=opts["trainers"], env=side_env(opts["train_gpus"]))
    finally:
        result["server_rc"] = stop_server(server)
        (out / "serve_remote.json").write_text(json.dumps(result, indent=2) + "\n")
    if compare:
        result["in_process"] = in_process(out, server_over, train_over)
        if "median_step_s" in result["in_process"] and "median_step_s" in result["train"]:
            result["step_ratio_remote_over_in_process"] = (result["train"]["median_step_s"]
                                                           / result["in_process"]["median_step_s"])
        (out / "serve_remote.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "server_info"}, indent=2)[:4000])
    return 0 if all(t["rc"] == 0 for t in result.get("trainers") or [result["train"]]) else 1


def weight_push(url: str, model_path: str, repeats: int = 3) -> dict:
    """The server's own weights pushed back over HTTP, in parts: serialising, the whole call, and the load
    into the engines as the server timed it."""
    import torch
    from safetensors.torch import load_file

    from rlgen.wire.client import GenerationClient
    from rlgen.wire.protocol import weights_to_bytes

    weights = {k: v.to(torch.bfloat16) for k, v in load_file(str(Path(model_path) / "model.safetensors")).items()}
    rows = []
    with GenerationClient(url) as c:
        version = int(c.info()["version"])
        for _ in range(repeats):
            t0 = time.time()
            blob = weights_to_bytes(weights)
            t1 = time.time()
            version += 1
            res = c.update_weights(weights, version)
            t2 = time.time()
            load = max((s["end"] - s["start"] for s in res["spans"]), default=0.0)
            rows.append({"bytes": len(blob), "serialise_s": t1 - t0, "call_s": t2 - t1, "engine_load_s": load})
    return {"rows": rows, "median_call_s": statistics.median(r["call_s"] for r in rows)}


def run_train(url: str, out: Path, train_over: list[str], info: dict, result: dict, trainers: int = 1,
              env: dict | None = None) -> None:
    """The client's throughput, then ``trainers`` training jobs against the server, one after the other (each
    joins once the one before has left): result["train"] is the first, result["trainers"] all of them."""
    from rlgen.wire.client import GenerationClient

    result["client_generate"] = client_throughput(url, int(info["vocab_size"]), int(info["max_model_len"]))
    if train_over == ["weights"]:  # the HTTP weight path alone, no training run
        result["weight_push"] = weight_push(url, info["model_path"])
        result["train"] = {"rc": 0}
        return
    with GenerationClient(url) as c:  # the OpenAI-style route answers on these engines too
        text = c.complete([[11, 12, 13, 14]], max_tokens=8, n=2, temperature=0.0, logprobs=1)
    result["v1_completions"] = {"choices": len(text["choices"]), "usage": text["usage"],
                                "finish": [ch["finish_reason"] for ch in text["choices"]]}
    result["trainers"] = []
    for k in range(trainers):
        t1 = time.time()
        run = out / ("run" if k == 0 else f"run{k + 1}")
        train = subprocess.run([sys.executable, "-m", "rlgen.cli", "train", "progress=false", f"hydra.run.dir={run}",
                                "engine=remote", f"engine.url={url}", *train_over], capture_output=True, text=True,
                               timeout=1800, env=env)
        one = {"rc": train.returncode, "wall_s": time.time() - t1, "stderr_tail": train.stderr[-2000:]}
        if (run / "metrics.jsonl").is_file():
            one.update(train_summary(run))
        with GenerationClient(url, timeout_s=10) as c:
            one["server_after"] = {k: v for k, v in c.info().items() if k in ("version", "versions", "counters")}
        result["trainers"].append(one)
    result["train"] = result["trainers"][0]
    with GenerationClient(url, timeout_s=10) as c:
        result["server_after"] = c.info()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
