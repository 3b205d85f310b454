"""`rlgen bench`: one RL-shaped generation workload, run on several engines side by side in one process.

The workload (``cfg.bench``) is random prompts with per-request lengths drawn from a seeded lognormal and
``ignore_eos``, so every engine does the same work. The engines (``cfg.bench.engines``: ``vllm`` as a training
run runs it, ``vllm_raw``, ``hf``) each run in a Ray actor with one GPU, one after another on the same
requests. Results (useful tokens/s, GPU busy %) go to ``<out_dir>/bench.json`` and a table. The settings and
what each number measures: docs/benchmarks.md ("vLLM engine and `rlgen bench`").

    python -m rlgen.bench engine=vllm model=qwen2_5_1_5b hardware=1xh100 [--out DIR]
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlgen.bench.gpu import BusySampler, MemorySampler, gpu_info, versions
from rlgen.bench.raw import run_raw_side
from rlgen.bench.sides import _env_vars, _get, run_hf_side, run_vllm_side
from rlgen.bench.workload import (
    HF_BUDGET_S,
    BenchError,
    make_workload,
    workload_summary,
)
from rlgen.charvocab import CHAR_VOCAB_SIZE
from rlgen.config import RunConfig, set_key
from rlgen.config.compose import ConfigError, compose_run_config
from rlgen.engines.registry import engine_spec
from rlgen.models import prepare_model
from rlgen.plan import live_vllm_env
from rlgen.plan.build import count_params
from rlgen.plan.model_folder import with_model_folder
from rlgen.plan.slots import SHARED_GPU_MAX_PARAMS
from rlgen.types import GenRequest


def engine_env(cfg: RunConfig) -> dict[str, str]:
    """cfg.engine.env as the plan passes it to vLLM engine actors."""
    return live_vllm_env(cfg.engine.env)[0]


def _build_model(cfg: RunConfig) -> str:
    import ray


    task = ray.remote(num_gpus=1, runtime_env={"env_vars": _env_vars()})(prepare_model)
    return _get(task.remote(cfg, "cuda"), "building the model folder")


def _load_weights_cpu(model_path: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    weights: dict[str, Any] = {}
    for f in sorted(Path(model_path).glob("*.safetensors")):
        weights.update(load_file(str(f), device="cpu"))
    return weights


def with_engines_per_gpu(cfg: RunConfig) -> RunConfig:
    """cfg with bench.engines_per_gpu resolved when null: 2 for an engine kind that splits its GPU's memory
    (vLLM) at TP 1 up to SHARED_GPU_MAX_PARAMS parameters (an engine core's CPU work sets the decode pace
    there), else 1."""

    if cfg.bench.engines_per_gpu is not None:
        return cfg
    e = cfg.engine
    small = count_params(with_model_folder(cfg).model)[0] <= SHARED_GPU_MAX_PARAMS
    shares = engine_spec(e.kind).memory_share and e.tensor_parallel_size == 1
    return set_key(cfg, "bench.engines_per_gpu", 2 if shares and small else 1)


def _check(cfg: RunConfig) -> None:
    # first: without a GPU nothing can run, whatever else the config says
    if not gpu_info():
        raise BenchError("rlgen bench needs a CUDA GPU (nvidia-smi found none); run it on a GPU machine.")
    b, e = cfg.bench, cfg.engine
    if "vllm" in b.engines and e.kind != "vllm":
        raise BenchError(
            f"bench engine 'vllm' runs rlgen's vLLM engine, but engine={e.kind}; add engine=vllm."
        )
    need = b.prompt_len + b.response_len_max
    if "vllm" in b.engines and e.max_model_len is not None and e.max_model_len < need:
        raise BenchError(
            f"engine.max_model_len={e.max_model_len} cannot hold bench.prompt_len + bench.response_len_max = {need}; "
            f"set engine.max_model_len>={need}."
        )
    if b.engines_per_gpu < 1:
        raise BenchError(f"bench.engines_per_gpu={b.engines_per_gpu}; it must be 1 or more.")
    if b.engines_per_gpu > 1 and e.tensor_parallel_size != 1:
        raise BenchError(
            f"bench.engines_per_gpu={b.engines_per_gpu} shares one GPU between engines, but "
            f"engine.tensor_parallel_size={e.tensor_parallel_size}; use engine.tensor_parallel_size=1 or "
            "bench.engines_per_gpu=1."
        )
    unknown = set(b.engines) - {"vllm", "hf", "vllm_raw"}
    if unknown:
        raise BenchError(f"bench.engines has {sorted(unknown)}; choose from vllm, hf, vllm_raw.")


def run_bench(
    cfg: RunConfig,
    out_dir: str,
    *,
    engine_args: dict[str, Any] | None = None,
    repeats: int = 1,
    hf_budget_s: float = HF_BUDGET_S,
    sync: bool = True,
    command: str | None = None,
) -> dict:
    """Run cfg.bench's workload on each engine of cfg.bench.engines; write bench.json; print a table."""
    import ray


    cfg = with_engines_per_gpu(cfg)
    _check(cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = cfg.model.vocab_size or CHAR_VOCAB_SIZE
    requests = make_workload(cfg.bench, vocab)
    machine = gpu_info()
    started_ray = _start_ray()
    mem = MemorySampler()
    busy = BusySampler()
    result = _new_result(cfg, requests, machine, vocab, command)
    try:
        t0 = time.time()
        model_path = _build_model(cfg)
        result["model"]["build_s"] = round(time.time() - t0, 1)
        result["model"]["path_is_local_build"] = cfg.model.path is None
        for side in cfg.bench.engines:  # one after another; each side frees the GPU before the next
            result["results"][side] = _run_side(
                side, cfg, model_path, requests, mem, busy,
                vocab=vocab, gpu_gib=machine.get("gpu_memory_gib", 80.0),
                engine_args=engine_args, repeats=repeats, sync=sync, hf_budget_s=hf_budget_s,
            )
            _write(out, result)
        result["ratios"] = ratios(result["results"])
    finally:
        mem.close()
        busy.close()
        if started_ray:
            ray.shutdown()
    _write(out, result)
    print_table(result)
    return result


def _start_ray() -> bool:
    """Ray for the engine actors, unless this process is already connected; True if it was started here."""
    import ray

    if ray.is_initialized():
        return False
    ray.init(
        address=os.environ.get("RAY_ADDRESS", "local"),  # a cluster of its own unless one is named
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": _env_vars()},
    )
    return True


def _new_result(
    cfg: RunConfig, requests: list[GenRequest], machine: dict[str, Any], vocab: int, command: str | None
) -> dict[str, Any]:
    """bench.json before any engine runs: when, how, where, with what, and an empty "results"."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command or " ".join(sys.argv),
        "machine": machine,
        "versions": versions(),
        "model": {"name": cfg.model.name, "vocab_size": vocab},
        "bench": asdict(cfg.bench),
        "engine": {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(cfg.engine).items()},
        "workload": workload_summary(requests),
        "results": {},
    }


def _run_side(
    side: str,
    cfg: RunConfig,
    model_path: str,
    requests: list[GenRequest],
    mem: MemorySampler,
    busy: BusySampler,
    *,
    vocab: int,
    gpu_gib: float,
    engine_args: dict[str, Any] | None,
    repeats: int,
    sync: bool,
    hf_budget_s: float,
) -> dict[str, Any]:
    """One engine of cfg.bench.engines on the workload; its record."""
    if side == "vllm":
        weights = _load_weights_cpu(model_path) if sync else None  # for the weight update after generation
        return run_vllm_side(
            model_path,
            cfg.engine,
            requests,
            mem,
            env=engine_env(cfg),
            engine_args=engine_args,
            seed=cfg.seed,
            repeats=repeats,
            sync_weights=weights,
            per_gpu=cfg.bench.engines_per_gpu,
            busy_gpu=busy,
        )
    if side == "vllm_raw":
        return run_raw_side(model_path, requests, mem, seed=cfg.seed, busy_gpu=busy)
    return run_hf_side(
        model_path,
        requests,
        mem,
        vocab=vocab,
        batch_rows=cfg.bench.hf_batch_size,
        gpu_gib=gpu_gib,
        seed=cfg.seed,
        budget_s=hf_budget_s,
    )


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    tps = {k: v.get("tokens_per_s") for k, v in results.items() if v.get("tokens_per_s")}
    out = {}
    if "vllm" in tps and "hf" in tps:
        out["vllm_over_hf"] = round(tps["vllm"] / tps["hf"], 2)
    if "vllm" in tps and "vllm_raw" in tps:
        out["vllm_over_raw"] = round(tps["vllm"] / tps["vllm_raw"], 3)
    return out


def _write(out: Path, result: dict) -> None:
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"rlgen bench: {result['model']['name']} on {result['machine'].get('gpu', '?')}")
    for col in (
        "engine",
        "tokens/s",
        "tokens",
        "wall s",
        "engine start s",
        "first batch s",
        "peak GPU GiB",
        "GPU busy %",
        "checks",
    ):
        t.add_column(col, justify="left" if col in ("engine", "checks") else "right")
    for name, r in result["results"].items():
        if r.get("engines_per_gpu", 1) > 1:
            name = f"{name} ({r['engines_per_gpu']} per GPU)"
        if "error" in r:
            t.add_row(name, "-", "-", "-", "-", "-", "-", "-", f"[red]{r['error'][:80]}[/]")
            continue
        checks = (
            "ok"
            if r.get("n_ok") and r.get("lengths_ok") and r.get("logprobs_ok") is not False
            else "[red]FAILED[/]"
        )
        if name == "hf" and "subset" in r:
            checks += f" ({r['subset']['prompts']}/{r['subset']['of_prompts']} prompts)"
        t.add_row(
            name,
            f"{r['tokens_per_s']:,.0f}",
            f"{r['tokens']:,}",
            f"{r['wall_s']:.1f}",
            f"{r['start_s']:.1f}",
            f"{r.get('first_batch_s', 0):.1f}",
            f"{r.get('peak_gpu_gib', 0):.1f}",
            f"{r['gpu_busy_pct']:.0f}" if r.get("gpu_busy_pct") is not None else "-",
            checks,
        )
    console = Console(width=max(Console().width, 130))
    console.print(t)
    w = result["workload"]
    console.print(
        f"workload: {w['prompts']} prompts x {w['samples_per_prompt']} samples, prompt {w['prompt_len']} tokens, "
        f"max_tokens median {w['max_tokens_median']} (min {w['max_tokens_min']}, max {w['max_tokens_max']}), "
        f"{w['response_tokens']:,} response tokens"
    )
    for k, v in result.get("ratios", {}).items():
        console.print(f"{k}: {v}x")
    sync = result["results"].get("vllm", {}).get("sync")
    if sync:
        console.print(
            f"weight update (vllm): {sync['gib']} GiB in {sync['engine_s']} s in the engine, {sync['driver_s']} s from the driver"
        )


# -- entry points --------------------------------------------------------------------------------------------
def compose(overrides: list[str]) -> RunConfig:

    return compose_run_config(overrides)


def main(argv: list[str] | None = None) -> int:

    argv = list(sys.argv[1:] if argv is None else argv)
    out_dir = f"outputs/bench-{time.strftime('%Y%m%d-%H%M%S')}"
    if "--out" in argv:
        i = argv.index("--out")
        if i + 1 >= len(argv):
            print("--out needs a directory", file=sys.stderr)
            return 2
        out_dir = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    try:
        run_bench(
            compose(argv), out_dir, command=" ".join(["python -m rlgen.bench", *argv, "--out", out_dir])
        )
    except (BenchError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"bench.json written to {out_dir}")
    return 0
