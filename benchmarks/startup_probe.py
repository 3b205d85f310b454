"""Where a run's start-up goes: the one-liner cold and then from its kept engines, phase by phase; or where a vLLM
engine's start-up and a rollout's decode time go, at the 0.5B one-liner's shape, on one GPU.

    python benchmarks/startup_probe.py OUT_DIR --runs [--one-liner "ARGS"] [--host-caches] [--keep] [OVERRIDES ...]
    python benchmarks/startup_probe.py OUT_DIR [--tokens 256] [--skip cold,warm,plan,pair]

``--runs``: the one-liner (``--one-liner``, by default ``engine=vllm hardware=1xh200 model=qwen2_5_0_5b steps=2``,
then OVERRIDES) twice, each as a command of its own: ``cold`` with a fresh ``cache_dir`` (so the random model
folder is built) after every Ray cluster an earlier run kept warm is stopped, then ``kept``, which takes over the
engines the cold run kept warm (``engine.keep_warm_s``). vLLM's, Triton's and torch's compile caches are fresh
folders too, as on a fresh host, unless ``--host-caches``. Then, in fresh interpreters, how long the start's
imports take on this host (the page cache warm by then). OUT_DIR/startup.json gets each run's start-up from its
summary.json (phases, when each began, each actor's steps), the critical path read from them, and the imports;
OUT_DIR/cold.log and kept.log are the runs' output. The kept cluster is stopped at the end unless ``--keep``. On a
CPU machine ``--one-liner "steps=2 engine.keep_warm_s=120"`` runs the same stages with hf engines.

The engine probe (without ``--runs``):

Runs rlgen's VLLMEngine (in this process, as a Ray actor would) on a random qwen2_5_0_5b folder at the
one-liner's engine share (0.45), stage by stage, and writes OUT_DIR/probe.json after each stage:

- ``cold``: the first start on this host (empty vLLM compile cache), with vLLM's startup plan on
  (``VLLM_ENABLE_STARTUP_PLAN=1``, which records the profiled KV-cache size). Then two generations at the
  one-liner's batch (64 prompts x 8 samples, ``--tokens`` each, ``ignore_eos``): with per-request seeds, as a
  training run samples, and without.
- ``warm``: a second start, compile cache present, startup plan off (vLLM profiles memory again).
- ``plan``: a third start with the startup plan on, which skips that profiling.
- ``pair``: two engines as Ray actors sharing the GPU (0.225 each), started at the same time with an explicit
  ``kv_cache_memory_bytes`` taken from the recorded plan, then the seeded generation dealt between them.

Each record has the engine's start-up clock (``import vllm``, vLLM engine start and vLLM's own parts), tokens/s
and the GPU's busy %. With ``benchmarks/stack_sampler`` first on PYTHONPATH and RLGEN_STACK_SAMPLES=DIR, every
process also writes stack samples (``benchmarks/stack_summary.py`` reads them).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHARE = 0.45  # the one-liner's derived engine.gpu_memory_utilization on one H100 (`rlgen plan`)


def requests(n_prompts: int, n: int, tokens: int, seeded: bool, vocab: int) -> list[Any]:
    from rlgen.types import GenRequest, SamplingParams

    rng = random.Random(0)
    sp = SamplingParams(n=n, max_new_tokens=tokens, ignore_eos=True, seed=12345 if seeded else None)
    return [GenRequest(prompt_ids=tuple(rng.randrange(vocab) for _ in range(16)), sampling=sp, group_id=i)
            for i in range(n_prompts)]


def timed_generate(engines: list[Any], reqs: list[Any], busy: Any, remote: bool) -> dict[str, Any]:
    import ray

    parts = [reqs[i::len(engines)] for i in range(len(engines))]
    busy.start()
    t0 = time.time()
    if remote:
        outs = ray.get([e.generate.remote(p) for e, p in zip(engines, parts)], timeout=900)
    else:
        outs = [e.generate(p) for e, p in zip(engines, parts)]
    wall = time.time() - t0
    tokens = sum(len(c.token_ids) for o in outs for c in o.completions)
    return {"wall_s": round(wall, 2), "tokens": tokens, "tokens_per_s": round(tokens / wall), "gpu_busy_pct": busy.stop()}


def start_local(model: str, engine_cfg: Any, env: dict[str, str], extra_env: dict[str, str]) -> tuple[Any, dict]:
    from rlgen.engines.vllm.engine import VLLMEngine

    os.environ.update(extra_env)
    t0 = time.time()
    eng = VLLMEngine(model, engine_cfg, env=env)
    rec = {"start_s": round(time.time() - t0, 2), "startup": eng.clock.to_dict()}
    return eng, rec


def recorded_kv_bytes() -> int | None:
    root = os.environ.get("VLLM_CACHE_ROOT", os.path.expanduser("~/.cache/vllm"))
    plans = sorted(glob.glob(os.path.join(root, "startup_plan", "*.json")), key=os.path.getmtime)
    return int(json.loads(Path(plans[-1]).read_text())["kv_cache_memory_bytes"]) if plans else None


ONE_LINER = "engine=vllm hardware=1xh200 model=qwen2_5_0_5b steps=2"
RUN_TIMEOUT_S = 360  # each run, its two steps and its end included (about 1-3 minutes): a hung run ends here
TARGETS_S = {"cold": 45.0, "kept": 15.0}  # the issue's: first rollout on a fresh host, and from kept engines
CACHE_VARS = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
IMPORTS = {  # what the start imports, each timed in a fresh interpreter
    "torch (and a GPU through NVML)": "import os; os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'; import torch; "
                                      "torch.cuda.is_available()",
    "transformers, tokenizer side": "import transformers as t; t.PreTrainedTokenizerBase; t.AutoConfig; t.AutoTokenizer",
    "transformers, the tokenizer by its class": "import transformers as t; t.PreTrainedTokenizerBase; "
                                                "import transformers.models.qwen2.tokenization_qwen2",
    "transformers, tokenizer and model sides": "import transformers as t; t.PreTrainedTokenizerBase; t.AutoConfig; "
                                               "t.AutoTokenizer; t.PreTrainedModel; t.AutoModelForCausalLM",
    "vllm": "import os; os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'; import torch; torch.cuda.is_available(); "
            "import vllm",
    "vllm's AsyncLLM": "import vllm; from vllm.v1.engine.async_llm import AsyncLLM",
    "deepspeed": "import deepspeed",
    "ray": "import ray",
}


def stop_kept_clusters() -> list[str]:
    """Stop every Ray cluster a run left or kept warm on this host (what a cold start must not take over)."""
    from rlgen.runtime.cluster.dead_runs import clean_leftovers

    return [str(p) for p in clean_leftovers(kept_too=True)]


def one_run(name: str, command: list[str], env: dict[str, str], run_dir: Path, log: Path) -> dict[str, Any]:
    """One run of the one-liner as a command of its own: its exit, wall time and summary.json's start-up."""
    t0 = time.time()
    with open(log, "wb") as f:
        try:
            rc = subprocess.run(command, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    rec: dict[str, Any] = {"command": " ".join(command), "rc": rc, "wall_s": round(time.time() - t0, 1)}
    summary = run_dir / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        rec["startup"] = s.get("startup", {})
        rec["setup_s"] = s.get("startup", {}).get("setup_s")
    else:
        rec["log_tail"] = log.read_text(errors="replace")[-4000:]
    rec["critical"] = critical_path(rec.get("startup") or {})
    print(f"[probe] {name}: rc {rc}, first rollout {rec['critical'].get('first_rollout_s')} s", flush=True)
    return rec


def critical_path(startup: dict[str, Any]) -> dict[str, Any]:
    """The seconds after launch at which each thing the first rollout waits for was done, from a run's start-up."""
    phases, began, actors = startup.get("phases") or {}, startup.get("began") or {}, startup.get("actors") or {}

    def end(phase: str) -> float | None:
        return round(began[phase] + phases[phase], 2) if phase in phases and phase in began else None

    engines = {n: a for n, a in actors.items() if n.startswith("engine")}
    learners = {n: a for n, a in actors.items() if n.startswith("learner")}
    out: dict[str, Any] = {
        "first_rollout_s": startup.get("first_rollout_s"),
        "set_up_began_s": phases.get("launch to set-up (imports, config, plan)"),
        "ray_ready_s": end("Ray cluster"),
        "model_folder_ready_s": end("model folder"),
        "task_ready_s": end("tokenizer and task"),
        "engines_asked_s": min((a["asked_s"] for a in engines.values() if a.get("asked_s") is not None), default=None),
        "engines_ready_s": max((a["ready_s"] for a in engines.values() if a.get("ready_s") is not None), default=None),
        "learners_ready_s": max((a["ready_s"] for a in learners.values() if a.get("ready_s") is not None), default=None),
        "first_batch_s": phases.get("first batch (generate, score)"),
        "engines": {n: {k: a.get(k) for k in ("asked_s", "init_begin_s", "ready_s", "steps", "parts", "kv_size",
                                               "core_start", "kept_warm") if a.get(k) is not None}
                    for n, a in engines.items()},
    }
    # what the first batch waited for last: the engines, or the tokenizer and task
    waits = {k: out[k] for k in ("engines_ready_s", "task_ready_s") if out[k] is not None}
    out["first_batch_waited_for"] = max(waits, key=lambda k: waits[k]) if waits else None
    return out


def time_imports(env: dict[str, str]) -> dict[str, Any]:
    """Seconds each of IMPORTS takes in a fresh interpreter (None: it failed, e.g. not installed)."""
    out: dict[str, Any] = {}
    for what, code in IMPORTS.items():
        t0 = time.time()
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        out[what] = round(time.time() - t0, 2) if done.returncode == 0 else None
    return out


def runs_main(args: argparse.Namespace) -> int:
    """--runs: the one-liner cold, then from its kept engines; OUT/startup.json."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="rlgen-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if not args.host_caches:  # as on a fresh host; the same for both runs (the kept cluster's fingerprint has them)
        for var in CACHE_VARS:
            env[var] = str(work / "caches" / var.lower())
    from rlgen.bench.gpu import gpu_info, versions

    result: dict[str, Any] = {"command": " ".join(sys.argv), "one_liner": args.one_liner, "overrides": args.overrides,
                              "machine": gpu_info(), "cpus": os.cpu_count(), "versions": versions(),
                              "work": str(work), "fresh_caches": not args.host_caches, "targets_s": TARGETS_S,
                              "stopped_before": stop_kept_clusters(), "runs": {}}

    def save() -> None:
        (out / "startup.json").write_text(json.dumps(result, indent=2) + "\n")

    base = [sys.executable, "-m", "rlgen.cli", "train", *args.one_liner.split(), f"cache_dir={work / 'cache'}"]
    for name in ("cold", "kept"):
        run_dir = work / "runs" / name
        result["runs"][name] = one_run(name, [*base, f"hydra.run.dir={run_dir}", *args.overrides], env, run_dir,
                                       out / f"{name}.log")
        save()
    kept = result["runs"]["kept"]["critical"]["engines"]
    result["kept_took_over"] = bool(kept) and all(e.get("kept_warm") for e in kept.values())
    if not args.keep:
        result["stopped_after"] = stop_kept_clusters()
    result["imports"] = time_imports(env)
    result["met"] = {name: (r["critical"].get("first_rollout_s") or float("inf")) <= TARGETS_S[name]
                     for name, r in result["runs"].items()}
    save()
    print(json.dumps({n: r["critical"] for n, r in result["runs"].items()}, indent=1), flush=True)
    print(f"[probe] imports: {json.dumps(result['imports'])}", flush=True)
    print(f"[probe] first rollout: cold {result['runs']['cold']['critical'].get('first_rollout_s')} s "
          f"(target {TARGETS_S['cold']:.0f}), kept {result['runs']['kept']['critical'].get('first_rollout_s')} s "
          f"(target {TARGETS_S['kept']:.0f}; took over: {result['kept_took_over']}); {out / 'startup.json'}", flush=True)
    return 0 if all(r["rc"] == 0 for r in result["runs"].values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--skip", default="")
    ap.add_argument("--runs", action="store_true", help="the one-liner cold, then from its kept engines")
    ap.add_argument("--one-liner", default=ONE_LINER, help="the run's arguments (--runs)")
    ap.add_argument("--work", default="", help="where the runs' caches and run folders go (--runs; a temp dir)")
    ap.add_argument("--host-caches", action="store_true", help="this host's compile caches, not fresh ones (--runs)")
    ap.add_argument("--keep", action="store_true", help="leave the kept cluster running at the end (--runs)")
    ap.add_argument("overrides", nargs="*", help="more overrides for both runs (--runs)")
    args = ap.parse_intermixed_args()
    if args.runs:
        return runs_main(args)
    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    t_launch = time.time()
    from rlgen.bench.gpu import gpu_info, versions
    from rlgen.bench.run import compose, engine_env
    from rlgen.gpubusy import BusySampler
    from rlgen.models import prepare_model

    cfg = compose(["engine=vllm", "hardware=1xh100", "model=qwen2_5_0_5b"])
    engine_cfg = dataclasses.replace(cfg.engine, gpu_memory_utilization=SHARE)
    env = engine_env(cfg)
    result: dict[str, Any] = {"command": " ".join(sys.argv), "machine": gpu_info(), "versions": versions(),
                              "share": SHARE, "tokens": args.tokens, "stages": {}}

    def save() -> None:
        (out / "probe.json").write_text(json.dumps(result, indent=2) + "\n")

    t0 = time.time()
    model = prepare_model(cfg, "cuda")
    result["model_folder_s"] = round(time.time() - t0, 2)
    result["imports_s"] = round(t0 - t_launch, 2)
    vocab = cfg.model.vocab_size
    busy = BusySampler()
    seeded = requests(64, 8, args.tokens, True, vocab)
    unseeded = requests(64, 8, args.tokens, False, vocab)

    for stage, plan_env in (("cold", "1"), ("warm", "0"), ("plan", "1")):
        if stage in skip:
            continue
        print(f"[probe] {stage}: starting", flush=True)
        try:
            eng, rec = start_local(model, engine_cfg, env, {"VLLM_ENABLE_STARTUP_PLAN": plan_env})
            rec["t_ready"] = round(time.time() - t_launch, 2)
            if stage == "cold":
                rec["seeded"] = timed_generate([eng], seeded, busy, False)
                rec["unseeded"] = timed_generate([eng], unseeded, busy, False)
                rec["seeded_again"] = timed_generate([eng], seeded, busy, False)
            eng.shutdown()
        except Exception as err:  # keep going: the other stages still say something
            rec = {"error": f"{type(err).__name__}: {err}"[:2000]}
        rec["kv_cache_memory_bytes_recorded"] = recorded_kv_bytes()
        result["stages"][stage] = rec
        save()
        print(f"[probe] {stage}: {json.dumps(rec)[:1500]}", flush=True)
        time.sleep(5)

    if "pair" not in skip:
        import ray

        from rlgen.bench.sides import _env_vars
        from rlgen.engines.vllm.engine import VLLMEngine

        kv = recorded_kv_bytes()
        rec: dict[str, Any] = {"kv_full_bytes": kv}
        try:
            total = int(float(gpu_info().get("gpu_memory_gib", 79.6)) * 2**30)
            half = dataclasses.replace(engine_cfg, gpu_memory_utilization=SHARE / 2)
            kv_half = int(kv - SHARE / 2 * total) if kv else None
            rec["kv_half_bytes"] = kv_half
            ray.init(address="local", include_dashboard=False, runtime_env={"env_vars": _env_vars(env)})
            t0 = time.time()
            actors = [ray.remote(VLLMEngine).options(num_gpus=0.5, max_concurrency=4).remote(
                model, half, env=env, name=f"engine{i}",
                engine_args={"kv_cache_memory_bytes": kv_half} if kv_half else None) for i in range(2)]
            health = ray.get([a.health.remote() for a in actors], timeout=600)
            rec["start_both_s"] = round(time.time() - t0, 2)
            rec["startup"] = [h["startup"] for h in health]
            rec["seeded"] = timed_generate(actors, seeded, busy, True)
            rec["unseeded"] = timed_generate(actors, unseeded, busy, True)
            ray.get([a.shutdown.remote() for a in actors], timeout=120)
        except Exception as err:
            rec["error"] = f"{type(err).__name__}: {err}"[:2000]
        result["stages"]["pair"] = rec
        save()
        print(f"[probe] pair: {json.dumps(rec)[:1500]}", flush=True)
    busy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
