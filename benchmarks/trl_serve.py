"""TRL's GRPOTrainer in server mode (``use_vllm=True, vllm_mode="server"``) against `rlgen serve`, timed.

    python benchmarks/trl_serve.py OUT                       # one GPU: generation only (the server's engine beside
                                                            # the trainer on GPU 0)
    python benchmarks/trl_serve.py OUT --gpus 2              # the server on GPU 1, the trainer on GPU 0, every
                                                            # step's weights pushed over TRL's NCCL path
    python benchmarks/trl_serve.py OUT --device cpu          # a CPU dry run: hf engines, generation only
    python benchmarks/trl_serve.py OUT --preset qwen2_5_1_5b --steps 8 --prompts 8 --generations 8 --new-tokens 256

The model folder is rlgen's build of ``--preset`` (random init, cached), served with ``model.path`` and given to
TRL as the same folder. The trainer is TRL's, unchanged, with its vLLM client pointed at the server. With one GPU,
TRL cannot join the server's workers over NCCL (they share its device), so its NCCL join and weight pushes are
left out and it generates from the served weights: generation only, as TRL's own docs suggest for one GPU. With
two, nothing is left out: each step TRL pauses the server, broadcasts its weights, and resumes it, and the
server's policy version counts the updates. The trainer then runs with NCCL_CUMEM_ENABLE=0, as the server's vLLM
engines do: NCCL's join fails when its two ends differ.

Writes OUT/trl_serve.json: the server's start-up seconds, the trainer's steps, its median step seconds (TRL's
``step_time`` when it logs one, else the wall time between logged steps), the reward and completion length per
step with TRL's measure of the server's logprobs against its own, and the server's counters afterwards (requests, sequences, weight updates, the engines' policy versions).
Past --limit-s (900 s from the server's start) it writes what it has, with timed_out_after_s, stops the server
and exits 3.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_remote import start_server, stop_server  # noqa: E402

PROMPTS = [f"{a} + {b} =" for a in range(1, 40) for b in range(1, 4)]


def _reward(completions: list[str], **_: object) -> list[float]:
    """Digits early in the answer: a cheap reward with some spread, so the loss is not zero."""
    return [sum(ch.isdigit() for ch in c[:8]) / 8.0 for c in completions]


def _generation_only() -> None:
    """TRL without its NCCL join and weight pushes (one GPU, or CPU); the prefix-cache reset stays."""
    import trl.generation.vllm_client as client_mod
    import trl.generation.vllm_generation as generation_mod

    client_mod.is_vllm_available = lambda *a, **k: True  # on CPU there is no vLLM; the client needs none
    generation_mod.is_vllm_available = lambda *a, **k: True
    client_mod.VLLMClient.init_communicator = lambda self, device=0: None
    generation_mod.VLLMGeneration.sync_weights = lambda self: self.vllm_client.reset_prefix_cache()


def _steps(history: list[dict]) -> list[dict]:
    keep = ("step", "reward", "completions/mean_length", "step_time", "loss",
            "sampling/sampling_logp_difference/mean")  # the server's logprobs against the trainer's
    return [{k: h[k] for k in keep if k in h} for h in history if "reward" in h]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--gpus", type=int, choices=(1, 2), default=1)
    ap.add_argument("--preset", default="qwen2_5_0_5b")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--generations", type=int, default=8, help="completions per prompt")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--memory", type=float, default=0.3, help="the server engine's GPU share with one GPU")
    ap.add_argument("--limit-s", type=float, default=900.0,
                    help="the trainer's wall-clock limit, from the server's start: past it the result so far is written "
                         "and the server stopped (a stuck NCCL join otherwise waits for ever)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cpu = args.device == "cpu"
    if not cpu and args.gpus == 2:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"  # the trainer's; the server gets GPU 1 below
        # as the server's vLLM engines run: NCCL's two ends must agree, or its join fails ("unhandled cuda error")
        os.environ["NCCL_CUMEM_ENABLE"] = "0"

    from rlgen.config.compose import compose_run_config
    from rlgen.models import prepare_model

    preset = "tiny" if cpu else args.preset
    folder = prepare_model(compose_run_config([f"model={preset}"]), device="cpu" if cpu else "cuda")
    server_over = [f"model={preset}", f"model.path={folder}"]
    if cpu:
        server_over += ["engine=hf"]
    else:
        server_over += ["engine=vllm", "hardware=1xh100", f"engine.max_model_len={64 + args.new_tokens}"]
        if args.gpus == 1:
            server_over += [f"engine.gpu_memory_utilization={args.memory}"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="1") if not cpu and args.gpus == 2 else None
    server, url, info, start_s = start_server(args.out, server_over, env=env)
    result: dict = {"device": args.device, "gpus": 0 if cpu else args.gpus, "preset": preset, "model": folder,
                    "server_overrides": server_over, "server_start_s": start_s,
                    "weights": "nccl" if not cpu and args.gpus == 2 else "none (generation only)"}
    watchdog = threading.Timer(args.limit_s, _give_up, (args, server, result))
    watchdog.daemon = True
    watchdog.start()
    try:
        if info is None:
            result["server_failed"] = (args.out / "serve.out").read_text()[-3000:]
            return 1
        if cpu or args.gpus == 1:
            _generation_only()
        import pyarrow as pa
        from datasets import Dataset
        from datasets.table import InMemoryTable
        from transformers import AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer

        config = GRPOConfig(output_dir=str(args.out / "trl"), use_vllm=True, vllm_mode="server",
                            vllm_server_base_url=url, use_cpu=cpu, bf16=not cpu, max_steps=args.steps,
                            per_device_train_batch_size=args.prompts * args.generations,
                            num_generations=args.generations, max_completion_length=args.new_tokens,
                            learning_rate=1e-6, logging_steps=1, save_strategy="no", report_to=[], seed=0,
                            vllm_server_timeout=120)
        rows = [{"prompt": p} for p in PROMPTS[: args.prompts * args.steps]]
        # a fingerprint of its own: datasets would hash the table with dill, which fails on some hosts
        # (PicklingError on pyarrow's MonthDayNano class)
        data = Dataset(InMemoryTable(pa.Table.from_pylist(rows)), fingerprint="trl-serve-prompts")
        trainer = GRPOTrainer(model=folder, reward_funcs=_reward, args=config,
                              train_dataset=data,
                              processing_class=AutoTokenizer.from_pretrained(folder))
        t0 = time.time()
        trainer.train()
        result["train_s"] = time.time() - t0
        steps = _steps(trainer.state.log_history)
        result["steps"] = steps
        times = [s["step_time"] for s in steps if "step_time" in s]
        if len(times) > 2:
            result["median_step_s"] = statistics.median(times[1:])  # the first step warms up
        from rlgen.wire.client import GenerationClient

        with GenerationClient(url, timeout_s=30) as c:
            after = c.info()
        result["server_after"] = {k: after.get(k) for k in ("requests", "sequences", "weight_updates", "versions")}
        return 0
    finally:
        watchdog.cancel()
        _finish(args, server, result)


def _finish(args: argparse.Namespace, server, result: dict) -> None:
    result["server_rc"] = stop_server(server)
    (args.out / "trl_serve.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=2), flush=True)


def _give_up(args: argparse.Namespace, server, result: dict) -> None:
    """Past --limit-s: the result so far (and that it timed out), the server stopped, and this process ended with
    exit code 3, whatever the trainer's threads are waiting in."""
    result["timed_out_after_s"] = args.limit_s
    _finish(args, server, result)
    os._exit(3)


if __name__ == "__main__":
    sys.exit(main())
