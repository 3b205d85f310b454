"""rlgen beside TRL's GRPOTrainer on one GPU: the same model folder, prompts, batch, prompt and response
lengths, reward and learning rate, one side after the other in one invocation, each in its own process.

    python benchmarks/peer_trl.py OUT                                  # 0.5B shape, 32k vocab, 8 x 8, 64 + 256
    python benchmarks/peer_trl.py OUT --preset qwen2_5_1_5b --prompts 64 --new-tokens 1024 --micro 8
    python benchmarks/peer_trl.py OUT --sides rlgen,rlgen_async,trl --steps 12 --warmup 2
    python benchmarks/peer_trl.py OUT --device cpu --preset tiny --vocab 2000 --new-tokens 8   # a CPU dry run
    python benchmarks/peer_trl.py --report OUT                         # the table again from OUT/peer.json

Sides:
- ``trl``: TRL's GRPOTrainer with vLLM colocated in its process (``vllm_mode="colocate"``), TRL's defaults
  otherwise (fp32 master weights under bf16 autocast, importance-sampling correction on). On CPU: no vLLM.
- ``rlgen``: ``rlgen train engine=vllm hardware=1xh100`` colocated, on-policy: the engine sleeps while the
  learner trains (``algo.async_steps=0``).
- ``rlgen_async``: the same with ``algo.async_steps=1``: the engine stays awake and generates the next batch
  while the learner trains; weight updates land in flight.
- ``rlgen_async_x2``: the same with two engines on the GPU (``engine.engines_per_gpu=2``), splitting the
  engine share and the prompts between them.
- ``rlgen:<name>:<override>``: another rlgen variant with one more override (e.g. ``rlgen:level2:sync.sleep_level=2``).

Every side runs ``--steps`` optimizer steps of ``--prompts`` x ``--samples`` sequences. A step's time is the
wall time between the ends of two consecutive steps, so each side's logging and bookkeeping count. The report
(OUT/peer.json and a table on stdout; sides already in OUT/peer.json for the same inputs stay, so one
comparison can span consecutive invocations) gives each side's median step after ``--warmup`` steps (the last
step left out: with async_steps=1 nothing is generated beside it), its time from
process launch to the end of its first step, whether its losses stayed finite, its mean response length, and
the ratio of every side's median step to TRL's (to the first side's when TRL is not run).

The model folder is built here (``--model`` takes an existing one): a byte-level BPE tokenizer of ``--vocab``
tokens and a randomly initialised model of the preset's shape, so responses run to the length limit on both
sides. Prompts are raw text (no chat template) of exactly ``--prompt-tokens`` tokens under that tokenizer.
TRL is not one of rlgen's dependencies: ``pip install 'rlgen[peer]'`` (trl 1.16 with vLLM 0.22-0.31).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
BUILTIN_SIDES = {
    "rlgen": ["algo.async_steps=0"],
    "rlgen_async": ["algo.async_steps=1"],
    "rlgen_async_x2": ["algo.async_steps=1", "engine.engines_per_gpu=2"],
}


# -- inputs ----------------------------------------------------------------------------------------------
def random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(60000)]
    return [" ".join(rng.choice(words) for _ in range(50)) for _ in range(n)]


def build_model(out: Path, preset: str, vocab: int, device: str) -> Path:
    """A model folder of the preset's shape with a `vocab`-token BPE tokenizer trained on random words."""
    from rlgen.config.compose import compose_run_config
    from rlgen.models.local import build_folder

    if (out / "config.json").is_file():
        return out
    shape = compose_run_config([f"model={preset}"]).model
    return build_folder(out, shape, random_texts(8000, seed=1), vocab_size=vocab, device=device)


def exact_prompts(model_dir: Path, n: int, tokens: int, seed: int = 0) -> list[str]:
    """n texts of exactly `tokens` tokens each (encoded without special tokens) under the folder's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out: list[str] = []
    for text in random_texts(50 * n + 100, seed):
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) < tokens:
            continue
        cut = tok.decode(ids[:tokens]).strip()
        if len(tok.encode(cut, add_special_tokens=False)) == tokens:
            out.append(cut)
            if len(out) == n:
                return out
    raise SystemExit(f"could not make {n} prompts of exactly {tokens} tokens; try another --prompt-tokens")


def write_data(path: Path, prompts: list[str]) -> Path:
    """JSONL rows for both sides; the answer is a fixed string that char_match scores against."""
    path.write_text("".join(json.dumps({"prompt": p, "answer": "the answer is forty two"}) + "\n" for p in prompts))
    return path


# -- the TRL side (runs in a process of its own) -------------------------------------------------------------
def trl_worker(spec: dict) -> None:
    import pyarrow as pa
    import torch
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlgen.tasks.rewards import char_match

    cuda = spec["device"] == "cuda"
    rows = [json.loads(line) for line in Path(spec["data"]).read_text().splitlines()]
    # A fingerprint of our own: datasets otherwise hashes the table with dill, which failed on one GPU host
    # (PicklingError on pyarrow's MonthDayNano class) before training began.
    data = Dataset(InMemoryTable(pa.Table.from_pylist(rows)), fingerprint="peer-trl-prompts")
    seqs = spec["prompts"] * spec["samples"]
    ends: list[float] = []
    logged: list[dict] = []

    class Times(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            ends.append(time.time())

        def on_log(self, args, state, control, logs=None, **kw):
            logged.append({k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))})

    def reward(completions, answer, **_):
        return [char_match(c, a) for c, a in zip(completions, answer)]

    args = GRPOConfig(
        output_dir=spec["work"],
        per_device_train_batch_size=spec["micro"],
        gradient_accumulation_steps=seqs // spec["micro"],
        num_generations=spec["samples"],
        max_completion_length=spec["new_tokens"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        gradient_checkpointing=spec["gradient_checkpointing"],
        bf16=cuda,
        use_cpu=not cuda,
        use_vllm=cuda,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=spec["engine_share"],
        vllm_max_model_length=spec["prompt_tokens"] + spec["new_tokens"] + 16,
        temperature=1.0,
        beta=0.0,
        max_steps=spec["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        shuffle_dataset=False,
        seed=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(spec["model"]), callbacks=[Times()])
    trainer.train()
    losses = [r["loss"] for r in logged if "loss" in r]
    lengths = [r["completions/mean_length"] for r in logged if "completions/mean_length" in r]
    Path(spec["result"]).write_text(json.dumps({"step_ends": ends, "losses": losses, "mean_length": lengths}))


# -- running the sides ---------------------------------------------------------------------------------------
def run_side(cmd: list[str], log: Path, timeout_s: float, env: dict | None = None) -> tuple[int, float]:
    """(exit code, launch time); the side runs in its own process group, killed whole on timeout."""
    launched = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            rc = 124
    if rc != 0:  # a side that failed or overran may leave Ray's daemons (and their GPU memory) behind
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True,
                       timeout=120, check=False)
    return rc, launched


def steady_median(steps: list[float], warmup: int) -> float | None:
    """The median of steps warmup .. n-2 (steps[k-1] is step k). The last step is left out too: with
    async_steps=1 no next batch is generated beside it, so it is not the steady state."""
    kept = steps[max(warmup - 1, 0):-1]
    return statistics.median(kept) if kept else None


def summarize(name: str, rc: int, launched: float, ends: list[float], losses: list[float], lengths: list[float],
              warmup: int, extra: dict | None = None) -> dict:
    steps = [b - a for a, b in zip(ends, ends[1:])]  # step k (k >= 1): end of k-1 to end of k
    return {
        "side": name,
        "rc": rc,
        "steps_done": len(ends),
        "median_step_s": steady_median(steps, warmup),
        "step_s": [round(s, 4) for s in steps],
        "first_step_s": ends[0] - launched if ends else None,
        "finite": bool(losses) and all(math.isfinite(x) for x in losses),
        "mean_response_tokens": statistics.fmean(lengths) if lengths else None,
        **(extra or {}),
    }


def trl_side(out: Path, spec: dict, warmup: int, timeout_s: float) -> dict:
    work = out / "trl"
    work.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "work": str(work), "result": str(work / "result.json")}
    (work / "spec.json").write_text(json.dumps(spec))
    rc, launched = run_side([sys.executable, str(HERE), "--trl-worker", str(work / "spec.json")], work / "log.txt",
                            timeout_s, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    res = json.loads((work / "result.json").read_text()) if (work / "result.json").is_file() else {}
    error = work / "error.txt"
    extra = {"error": error.read_text().strip().splitlines()[-1]} if error.is_file() else {}
    return summarize("trl", rc, launched, res.get("step_ends", []), res.get("losses", []),
                     res.get("mean_length", []), warmup, extra)


def rlgen_side(out: Path, name: str, overrides: list[str], spec: dict, warmup: int, timeout_s: float) -> dict:
    work = out / name
    work.mkdir(parents=True, exist_ok=True)
    gpu = spec["device"] == "cuda"
    cmd = [sys.executable, "-m", "rlgen.cli", "train", f"hydra.run.dir={work / 'run'}", "progress=false",
           f"model.path={spec['model']}", "task=jsonl", f"task.path={spec['data']}", "task.prompt_format=raw",
           f"task.max_prompt_tokens={spec['prompt_tokens']}", "task.reward=char_match",
           f"algo.prompts_per_step={spec['prompts']}", f"algo.samples_per_prompt={spec['samples']}",
           f"algo.max_new_tokens={spec['new_tokens']}", f"algo.lr={spec['lr']}", f"algo.micro_batch_size={spec['micro']}",
           f"learner.gradient_checkpointing={str(spec['gradient_checkpointing']).lower()}", f"steps={spec['steps']}",
           "checkpoint.every=0", "checkpoint.keep=1"]
    if gpu:
        cmd += ["engine=vllm", f"hardware={spec['hardware']}", f"engine.gpu_memory_utilization={spec['engine_share']}",
                f"engine.max_model_len={spec['prompt_tokens'] + spec['new_tokens'] + 16}"]
    else:
        cmd += ["engine=hf", "hardware=cpu"]
    cmd += overrides
    rc, launched = run_side(cmd, work / "log.txt", timeout_s)
    metrics = work / "run" / "metrics.jsonl"
    recs = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    summary_path = work / "run" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    extra = {k: summary[k] for k in ("first_rollout_s", "setup_s", "sync_warmup_s") if k in summary}
    for key in ("generate_s", "train_s", "sync_s", "sync_pause_s", "overlap_efficiency", "sync_start_s", "sync_load_s",
                "sync_pack_s", "sync_finish_s"):
        vals = [r[key] for r in recs[warmup:] if key in r]
        if vals:
            extra[f"median_{key}"] = statistics.median(vals)
    extra["overrides"] = overrides
    return summarize(name, rc, launched, [r["t_end"] for r in recs], [r["loss"] for r in recs],
                     [r["response_tokens"] / r["sequences"] for r in recs], warmup, extra)


def parse_side(text: str) -> tuple[str, list[str]]:
    if text == "trl" or text in BUILTIN_SIDES:
        return text, BUILTIN_SIDES.get(text, [])
    kind, _, rest = text.partition(":")
    name, _, overrides = rest.partition(":")
    if kind != "rlgen" or not name:
        raise SystemExit(f"--sides: {text!r} is not trl, {', '.join(BUILTIN_SIDES)} or rlgen:<name>:<overrides>")
    return name, [o for o in overrides.split(",") if o]


def table(results: list[dict]) -> str:
    timed = [r for r in results if r.get("median_step_s")]
    base = next((r for r in timed if r["side"] == "trl"), timed[0] if timed else {}).get("median_step_s")
    lines = ["| side | rc | median step s | vs base | first step s (from launch) | finite | response tokens |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for r in results:
        med = r.get("median_step_s")
        ratio = f"{med / base:.2f}x" if med and base else "-"
        first = f"{r['first_step_s']:.1f}" if r.get("first_step_s") is not None else "-"
        toks = f"{r['mean_response_tokens']:.0f}" if r.get("mean_response_tokens") else "-"
        lines.append(f"| {r['side']} | {r['rc']} | {med:.3f} | {ratio} | {first} | {r['finite']} | {toks} |"
                     if med else f"| {r['side']} | {r['rc']} | - | - | {first} | {r['finite']} | {toks} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--report":  # the table again from OUT/peer.json
        report = json.loads(Path(sys.argv[2], "peer.json").read_text())
        for r in report["sides"]:
            r["median_step_s"] = steady_median(r["step_s"], report["warmup"])
        Path(sys.argv[2], "peer.json").write_text(json.dumps(report, indent=2))
        print(table(report["sides"]))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--trl-worker":
        spec = json.loads(Path(sys.argv[2]).read_text())
        try:
            trl_worker(spec)
        except BaseException:
            import traceback

            Path(spec["work"], "error.txt").write_text(traceback.format_exc())
            raise
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--model", help="an existing model folder (default: build one in OUT/model)")
    ap.add_argument("--preset", default="qwen2_5_0_5b")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--micro", type=int, default=16, help="learner micro-batch, both sides")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--no-gradient-checkpointing", action="store_true")
    ap.add_argument("--engine-share", type=float, default=0.35, help="vLLM gpu_memory_utilization, both sides")
    ap.add_argument("--hardware", default="1xh100", help="rlgen's hardware preset")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    ap.add_argument("--sides", default="rlgen,rlgen_async,trl")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per side")
    args = ap.parse_args()

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.time()
    model = Path(args.model).resolve() if args.model else build_model(out / "model", args.preset, args.vocab,
                                                                       args.device)
    build_s = time.time() - t0
    data = write_data(out / "prompts.jsonl", exact_prompts(model, args.prompts * (args.steps + 2), args.prompt_tokens))
    spec = {"model": str(model), "data": str(data), "device": args.device, "prompts": args.prompts,
            "samples": args.samples, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
            "micro": args.micro, "lr": args.lr, "gradient_checkpointing": not args.no_gradient_checkpointing,
            "engine_share": args.engine_share, "hardware": args.hardware, "steps": args.steps}
    results = []
    earlier = out / "peer.json"
    if earlier.is_file():  # sides run before into this OUT on the same inputs (the machine allows one call's time)
        prev = json.loads(earlier.read_text())
        if prev["spec"] == spec:
            wanted = {parse_side(t)[0] for t in args.sides.split(",")}
            results = [r for r in prev["sides"] if r["side"] not in wanted]
    for text in args.sides.split(","):
        name, overrides = parse_side(text)
        print(f"== {name} {' '.join(overrides)}", flush=True)
        r = (trl_side(out, spec, args.warmup, args.timeout) if name == "trl"
             else rlgen_side(out, name, overrides, spec, args.warmup, args.timeout))
        print(json.dumps({k: v for k, v in r.items() if k != "step_s"}), flush=True)
        results.append(r)
    report = {"spec": spec, "model_build_s": build_s, "warmup": args.warmup, "sides": results,
              "date": time.strftime("%Y-%m-%d"), "versions": versions()}
    (out / "peer.json").write_text(json.dumps(report, indent=2))
    print(table(results))


def versions() -> dict:
    import importlib.metadata as md

    found = {}
    for pkg in ("rlgen", "trl", "vllm", "torch", "transformers", "deepspeed", "ray", "accelerate"):
        try:
            found[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            found[pkg] = None
    try:
        import torch

        if torch.cuda.is_available():
            found["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return found


if __name__ == "__main__":
    main()
