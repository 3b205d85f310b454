"""`rlgen bench`: one RL-shaped generation workload, run on several engines side by side in one process.

The workload (``cfg.bench``): ``num_prompts`` random prompts of ``prompt_len`` token ids, ``samples_per_prompt``
samples each, and a per-request ``max_tokens`` drawn from a seeded lognormal (median ``response_len_median``,
sigma ``response_len_sigma``) clipped to [``response_len_min``, ``response_len_max``]. ``ignore_eos`` holds every
response to its drawn length, so all engines do the same work and lengths vary the way RL rollouts do.

Engines (``cfg.bench.engines``), each in its own Ray actor with one GPU, one after another on the same requests:
- ``vllm``: rlgen's VLLMEngine with ``cfg.engine``, as the orchestrator runs it in production.
- ``vllm_raw``: ``vllm.LLM(model).generate`` with vLLM's default engine settings and the same sampling params.
- ``hf``: rlgen's HFEngine (transformers ``generate``) on a prefix of the prompts, batch after batch, until a
  time budget is spent; its tokens/s is over the batches it finished.

Useful tokens/s = generated tokens / wall time of the generate call, measured by the driver around the actor
call (so it includes returning the completions). Results go to ``<out_dir>/bench.json`` and a table.

    python -m rlgen.bench engine=vllm model=qwen2_5_1_5b hardware=1xh100 [--out DIR]
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlgen.config import VLLM_ENV_REMOVED_IN_0_26, BenchConfig, EngineConfig, EngineKind, RunConfig
from rlgen.types import Completion, GenRequest, SamplingParams

GIB = 2**30
ACTOR_TIMEOUT_S = 1800.0
HF_BUDGET_S = 90.0  # hf runs batches until this much generate time is spent (at least one batch)
HF_MEMORY_FRACTION = 0.6  # of the GPU, for the full-vocabulary logits HFEngine keeps per generated token
HF_LOGIT_BYTES = 16.0  # float32 logits per (row, step, vocab entry) at HFEngine's peak: kept, stacked, scaled, log-softmaxed


class BenchError(RuntimeError):
    """The bench cannot run as configured; the message says why and what to do."""


# -- workload ------------------------------------------------------------------------------------------------
def response_lengths(b: BenchConfig) -> list[int]:
    """Per-prompt max_tokens: lognormal(median, sigma), rounded and clipped; seeded by b.seed."""
    import numpy as np

    rng = np.random.default_rng(b.seed + 1)
    raw = b.response_len_median * np.exp(b.response_len_sigma * rng.standard_normal(b.num_prompts))
    return [int(x) for x in np.clip(np.rint(raw), b.response_len_min, b.response_len_max)]


def make_workload(b: BenchConfig, vocab_size: int) -> list[GenRequest]:
    """The bench's requests: one per prompt, n=samples_per_prompt, sampled at temperature 1."""
    import numpy as np

    if b.num_prompts < 1 or b.samples_per_prompt < 1 or b.prompt_len < 1:
        raise BenchError(
            "bench.num_prompts, bench.samples_per_prompt and bench.prompt_len must be at least 1."
        )
    if not 1 <= b.response_len_min <= b.response_len_max:
        raise BenchError("need 1 <= bench.response_len_min <= bench.response_len_max.")
    rng = np.random.default_rng(b.seed)
    prompts = rng.integers(3, vocab_size, size=(b.num_prompts, b.prompt_len))  # [N, P]; ids 0-2 are special
    lengths = response_lengths(b)
    return [
        GenRequest(
            prompt_ids=tuple(int(t) for t in prompts[i]),
            sampling=SamplingParams(
                n=b.samples_per_prompt, temperature=1.0, top_p=1.0, max_new_tokens=lengths[i], ignore_eos=True
            ),
            group_id=i,
        )
        for i in range(b.num_prompts)
    ]


def workload_summary(requests: list[GenRequest]) -> dict[str, Any]:
    lens = sorted(r.sampling.max_new_tokens for r in requests)
    n = requests[0].sampling.n if requests else 0
    return {
        "prompts": len(requests),
        "samples_per_prompt": n,
        "sequences": sum(r.sampling.n for r in requests),
        "prompt_len": len(requests[0].prompt_ids) if requests else 0,
        "response_tokens": sum(r.sampling.n * r.sampling.max_new_tokens for r in requests),
        "max_tokens_min": lens[0] if lens else 0,
        "max_tokens_median": lens[len(lens) // 2] if lens else 0,
        "max_tokens_mean": sum(lens) / len(lens) if lens else 0,
        "max_tokens_max": lens[-1] if lens else 0,
    }


def check_completions(requests: list[GenRequest], completions: list[Completion]) -> dict[str, Any]:
    """Counts and checks: n per request, lengths equal to max_tokens (ignore_eos), logprobs finite and <= 0."""
    expected = [r.sampling.max_new_tokens for r in requests for _ in range(r.sampling.n)]
    tokens = sum(len(c.token_ids) for c in completions)
    count_ok = len(completions) == len(expected)
    lengths_ok = count_ok and all(len(c.token_ids) == e for c, e in zip(completions, expected))
    lp_ok = all(len(c.logprobs) == len(c.token_ids) for c in completions) and all(
        math.isfinite(x) and x <= 1e-6 for c in completions for x in c.logprobs
    )
    return {
        "tokens": tokens,
        "completions": len(completions),
        "n_ok": count_ok,
        "lengths_ok": lengths_ok,
        "logprobs_ok": lp_ok,
    }


# -- machine facts -------------------------------------------------------------------------------------------
def _smi(query: str) -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_info() -> dict[str, Any]:
    rows = _smi("name,driver_version,memory.total")
    if not rows:
        return {}
    name, driver, total = (x.strip() for x in rows[0].split(","))
    return {"gpu": name, "driver": driver, "gpu_memory_gib": float(total) / 1024, "gpus": len(rows)}


def visible_gpus() -> list[int] | None:
    """The physical indices CUDA_VISIBLE_DEVICES names (None: all GPUs, or ids that are not indices)."""
    ids = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not ids:
        return None
    try:
        return [int(x) for x in ids.split(",") if x.strip()]
    except ValueError:
        return None


def gpu_used_gib() -> float | None:
    """Memory in use (all processes) summed over this process's GPUs."""
    rows = _smi("memory.used")
    if not rows:
        return None
    ids = visible_gpus()
    picked = [rows[i] for i in ids if i < len(rows)] if ids is not None else rows
    return sum(float(r) for r in picked) / 1024


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for pkg in ("vllm", "torch", "transformers", "ray"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out


class MemorySampler:
    """Polls the GPU's used memory (all processes) on a thread; peak() is the highest reading since mark()."""

    def __init__(self, period_s: float = 0.5):
        self.period_s = period_s
        self._peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="gpu-mem", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            used = gpu_used_gib()
            if used is not None:
                self._peak = max(self._peak, used)
            self._stop.wait(self.period_s)

    def mark(self) -> None:
        self._peak = gpu_used_gib() or 0.0

    def peak(self) -> float:
        return self._peak

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def wait_gpu_free(baseline_gib: float, timeout_s: float = 90.0) -> float:
    """Wait until GPU memory falls back near baseline after an actor is killed; returns seconds waited."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        used = gpu_used_gib()
        if used is None or used < baseline_gib + 1.0:
            break
        time.sleep(1.0)
    return time.time() - t0


# -- the raw vLLM side ---------------------------------------------------------------------------------------
class RawVLLM:
    """``vllm.LLM`` with vLLM's defaults (only ``skip_tokenizer_init`` and ``seed`` set), as a Ray actor body."""

    def __init__(self, model_path: str, seed: int = 0, llm_kwargs: dict[str, Any] | None = None):
        t0 = time.time()
        from vllm import LLM

        self.llm = LLM(model=model_path, skip_tokenizer_init=True, seed=seed, **(llm_kwargs or {}))
        self.start_s = time.time() - t0

    def ready(self) -> float:
        return self.start_s

    def shutdown(self) -> None:
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()

    def generate(self, requests: list[GenRequest], logprobs: int | None = 0) -> dict[str, Any]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [
            VSamplingParams(
                n=r.sampling.n,
                temperature=r.sampling.temperature,
                top_p=r.sampling.top_p,
                max_tokens=r.sampling.max_new_tokens,
                ignore_eos=r.sampling.ignore_eos,
                seed=r.sampling.seed,
                logprobs=logprobs,
                detokenize=False,
            )
            for r in requests
        ]
        t0 = time.time()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        t1 = time.time()
        completions = []
        for r, out in zip(requests, outs):
            for o in sorted(out.outputs, key=lambda o: o.index):
                toks = list(o.token_ids)
                lps = (
                    [pos[t].logprob for t, pos in zip(toks, o.logprobs)]
                    if logprobs is not None
                    else [0.0] * len(toks)
                )
                completions.append(Completion(r.group_id, list(r.prompt_ids), toks, lps, o.finish_reason, 0))
        return {"completions": completions, "spans": [("generate", t0, t1)], "version": 0}


# -- running one side ----------------------------------------------------------------------------------------
def _env_vars(extra: dict[str, str] | None = None) -> dict[str, str]:
    """What every actor's process needs from this one (import path, host-level vLLM switches)."""
    keep = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "HF_", "CUDA_HOME"))}
    if os.environ.get("PYTHONPATH"):  # absolute, since actors do not start in this directory
        keep["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p
        )
    keep.update(extra or {})
    return keep


def _get(ref: Any, what: str, timeout: float = ACTOR_TIMEOUT_S) -> Any:
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        return ray.get(ref, timeout=timeout)
    except GetTimeoutError as err:
        raise BenchError(f"{what} did not finish within {timeout:.0f} s.") from err


def _finish_side(
    actor: Any, mem: MemorySampler, baseline: float, rec: dict[str, Any], graceful: bool = True
) -> dict[str, Any]:
    import ray

    rec["peak_gpu_gib"] = round(max(mem.peak() - baseline, 0.0), 2)
    if graceful:  # stop vLLM's engine-core processes before the actor goes, so the GPU is freed
        try:
            ray.get(actor.shutdown.remote(), timeout=120)
        except Exception:  # noqa: BLE001 - the actor may already be dead; it is killed next either way
            pass
    ray.kill(actor)
    rec["teardown_s"] = round(wait_gpu_free(baseline), 1)
    return rec


def run_vllm_side(
    model_path: str,
    engine: EngineConfig,
    requests: list[GenRequest],
    mem: MemorySampler,
    *,
    env: dict[str, str] | None = None,
    engine_args: dict[str, Any] | None = None,
    seed: int = 0,
    repeats: int = 1,
    sync_weights: dict[str, Any] | None = None,
    extra: dict[str, list[GenRequest]] | None = None,
    label: str = "vllm",
) -> dict[str, Any]:
    """rlgen's VLLMEngine in a Ray actor with tensor_parallel_size GPUs, as in production. ``extra`` names
    further workloads to run on the same engine afterwards (reported under "extra")."""
    import ray

    from rlgen.engines.vllm import VLLMEngine

    baseline = gpu_used_gib() or 0.0
    mem.mark()
    t0 = time.time()
    actor = (
        ray.remote(VLLMEngine)
        .options(
            num_gpus=engine.tensor_parallel_size, max_concurrency=4, runtime_env={"env_vars": _env_vars(env)}
        )
        .remote(model_path, engine, device="cuda", seed=seed, name=label, env=env, engine_args=engine_args)
    )
    try:
        health = _get(actor.health.remote(), f"{label}: engine start")
        rec: dict[str, Any] = {
            "engine": label,
            "start_s": round(time.time() - t0, 1),
            "engine_start_s": round(health["start_s"], 1),
        }
        rec["engine_args"] = {k: v for k, v in (engine_args or {}).items()}
        runs = []
        for i in range(max(1, repeats)):
            t1 = time.time()
            res = _get(actor.generate.remote(requests), f"{label}: generate")
            wall = time.time() - t1
            if i == 0:
                rec["first_batch_s"] = round(time.time() - t0, 1)
            ((phase, a, b),) = res["spans"]
            chk = check_completions(requests, res["completions"])
            runs.append({"wall_s": wall, "engine_s": b - a, **chk})
        rec.update(_summarise_runs(runs))
        for name, reqs in (extra or {}).items():
            t1 = time.time()
            res = _get(actor.generate.remote(reqs), f"{label}: generate ({name})")
            wall = time.time() - t1
            ((phase, a, b),) = res["spans"]
            run = {"wall_s": wall, "engine_s": b - a, **check_completions(reqs, res["completions"])}
            rec.setdefault("extra", {})[name] = _summarise_runs([run])
        if sync_weights is not None:
            rec["sync"] = {"error": "not finished"}
            t1 = time.time()
            ref = ray.put(sync_weights)
            up = _get(actor.update_weights.remote(ref, 1), f"{label}: update_weights")
            rec["sync"] = {
                "engine_s": round(up["seconds"], 2),
                "driver_s": round(time.time() - t1, 2),
                "gib": round(up["bytes"] / GIB, 2),
                "tensors": up["tensors"],
                "prefix_cache_reset": up["prefix_cache_reset"],
            }
    except Exception as err:  # noqa: BLE001 - one side failing must not lose the others' numbers
        msg = f"{type(err).__name__}: {err}"
        if "rec" in locals() and rec.get("sync") == {"error": "not finished"}:
            rec["sync"] = {"error": msg[-2000:]}  # generation finished; keep its numbers
        else:
            rec = {"engine": label, "error": msg[-2000:]}
    return _finish_side(actor, mem, baseline, rec)


def run_raw_side(
    model_path: str,
    requests: list[GenRequest],
    mem: MemorySampler,
    *,
    seed: int = 0,
    llm_kwargs: dict[str, Any] | None = None,
    logprobs_variants: tuple[int | None, ...] = (0,),
    label: str = "vllm_raw",
) -> dict[str, Any]:
    """vllm.LLM with default settings in a Ray actor with one GPU; one run per logprobs setting."""
    import ray

    baseline = gpu_used_gib() or 0.0
    mem.mark()
    t0 = time.time()
    actor = (
        ray.remote(RawVLLM)
        .options(num_gpus=1, runtime_env={"env_vars": _env_vars()})
        .remote(model_path, seed, llm_kwargs)
    )
    try:
        _get(actor.ready.remote(), f"{label}: engine start")
        rec: dict[str, Any] = {
            "engine": label,
            "start_s": round(time.time() - t0, 1),
            "llm_kwargs": dict(llm_kwargs or {}),
        }
        for i, lp in enumerate(logprobs_variants):
            t1 = time.time()
            res = _get(actor.generate.remote(requests, lp), f"{label}: generate")
            wall = time.time() - t1
            if i == 0:
                rec["first_batch_s"] = round(time.time() - t0, 1)
            ((phase, a, b),) = res["spans"]
            chk = check_completions(requests, res["completions"])
            if lp is None:
                chk["logprobs_ok"] = None
            run = {"wall_s": wall, "engine_s": b - a, **chk}
            if i == 0:
                rec.update(_summarise_runs([run]))
            else:
                rec[f"logprobs_{lp}"] = _summarise_runs([run])
    except Exception as err:  # noqa: BLE001
        rec = {"engine": label, "error": f"{type(err).__name__}: {err}"}
    return _finish_side(actor, mem, baseline, rec)


def hf_chunks(
    requests: list[GenRequest], max_rows: int, vocab: int, gpu_bytes: float
) -> list[list[GenRequest]]:
    """Requests in order, cut into batches HFEngine can hold: it keeps full-vocabulary float32 logits for
    every generated token, about HF_LOGIT_BYTES x rows x longest length x vocab at its peak."""
    budget = HF_MEMORY_FRACTION * gpu_bytes
    chunks: list[list[GenRequest]] = []
    cur: list[GenRequest] = []
    rows = longest = 0
    for r in requests:
        n, L = r.sampling.n, r.sampling.max_new_tokens
        fits = rows + n <= max_rows and HF_LOGIT_BYTES * (rows + n) * max(longest, L) * vocab <= budget
        if cur and not fits:
            chunks.append(cur)
            cur, rows, longest = [], 0, 0
        cur.append(r)
        rows += n
        longest = max(longest, L)
    if cur:
        chunks.append(cur)
    return chunks


def run_hf_side(
    model_path: str,
    requests: list[GenRequest],
    mem: MemorySampler,
    *,
    vocab: int,
    batch_rows: int,
    gpu_gib: float,
    seed: int = 0,
    budget_s: float = HF_BUDGET_S,
    label: str = "hf",
) -> dict[str, Any]:
    """rlgen's HFEngine in a Ray actor with one GPU, batch after batch until budget_s of generation."""
    import ray

    from rlgen.engines.hf import HFEngine

    baseline = gpu_used_gib() or 0.0
    mem.mark()
    t0 = time.time()
    cfg = EngineConfig(kind=EngineKind.hf, dtype="bfloat16", max_num_seqs=batch_rows)
    actor = (
        ray.remote(HFEngine)
        .options(num_gpus=1, runtime_env={"env_vars": _env_vars()})
        .remote(model_path, cfg, device="cuda", seed=seed, name=label)
    )
    try:
        _get(actor.health.remote(), f"{label}: engine start")
        rec: dict[str, Any] = {"engine": label, "start_s": round(time.time() - t0, 1)}
        chunks = hf_chunks(requests, batch_rows, vocab, gpu_gib * GIB)
        runs, done = [], []
        spent = 0.0
        for chunk in chunks:
            if runs and spent >= budget_s:
                break
            t1 = time.time()
            res = _get(actor.generate.remote(chunk), f"{label}: generate")
            wall = time.time() - t1
            if not runs:
                rec["first_batch_s"] = round(time.time() - t0, 1)
            spent += wall
            ((phase, a, b),) = res["spans"]
            runs.append({"wall_s": wall, "engine_s": b - a, **check_completions(chunk, res["completions"])})
            done.extend(chunk)
        rec.update(_summarise_runs(runs, combine=True))
        rec["subset"] = {
            "prompts": len(done),
            "of_prompts": len(requests),
            "batches": len(runs),
            "rows_per_batch": [sum(r.sampling.n for r in c) for c in chunks[: len(runs)]],
        }
    except Exception as err:  # noqa: BLE001
        rec = {"engine": label, "error": f"{type(err).__name__}: {err}"}
    return _finish_side(actor, mem, baseline, rec, graceful=False)


def _summarise_runs(runs: list[dict[str, Any]], combine: bool = False) -> dict[str, Any]:
    """combine=True: the runs are parts of one workload (sum them); else repeats of it (report each, best)."""
    if combine:
        tokens = sum(r["tokens"] for r in runs)
        wall = sum(r["wall_s"] for r in runs)
        eng = sum(r["engine_s"] for r in runs)
        return {
            "tokens": tokens,
            "wall_s": round(wall, 2),
            "engine_s": round(eng, 2),
            "tokens_per_s": round(tokens / wall, 1) if wall else 0.0,
            "engine_tokens_per_s": round(tokens / eng, 1) if eng else 0.0,
            "n_ok": all(r["n_ok"] for r in runs),
            "lengths_ok": all(r["lengths_ok"] for r in runs),
            "logprobs_ok": all(r["logprobs_ok"] for r in runs),
        }
    per = [
        {
            **r,
            "wall_s": round(r["wall_s"], 2),
            "engine_s": round(r["engine_s"], 2),
            "tokens_per_s": round(r["tokens"] / r["wall_s"], 1),
        }
        for r in runs
    ]
    first = per[0]
    out = {
        k: first[k]
        for k in ("tokens", "wall_s", "engine_s", "tokens_per_s", "n_ok", "lengths_ok", "logprobs_ok")
    }
    out["engine_tokens_per_s"] = round(first["tokens"] / first["engine_s"], 1) if first["engine_s"] else 0.0
    if len(per) > 1:
        out["runs"] = per
    return out


# -- the whole bench -----------------------------------------------------------------------------------------
def engine_env(cfg: RunConfig) -> dict[str, str]:
    """cfg.engine.env without the variables vLLM 0.26 no longer reads (the plan drops them the same way)."""
    return {k: str(v) for k, v in cfg.engine.env.items() if k not in VLLM_ENV_REMOVED_IN_0_26}


def _build_model(cfg: RunConfig) -> str:
    import ray

    from rlgen.models import prepare_model

    task = ray.remote(num_gpus=1, runtime_env={"env_vars": _env_vars()})(prepare_model)
    return _get(task.remote(cfg, "cuda"), "building the model folder")


def _load_weights_cpu(model_path: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    weights: dict[str, Any] = {}
    for f in sorted(Path(model_path).glob("*.safetensors")):
        weights.update(load_file(str(f), device="cpu"))
    return weights


def _check(cfg: RunConfig) -> None:
    b, e = cfg.bench, cfg.engine
    if not gpu_info():
        raise BenchError("rlgen bench needs a CUDA GPU (nvidia-smi found none); run it on a GPU machine.")
    if "vllm" in b.engines and e.kind != EngineKind.vllm:
        raise BenchError(
            f"bench engine 'vllm' runs rlgen's vLLM engine, but engine={e.kind.value}; add engine=vllm."
        )
    need = b.prompt_len + b.response_len_max
    if "vllm" in b.engines and e.max_model_len < need:
        raise BenchError(
            f"engine.max_model_len={e.max_model_len} cannot hold bench.prompt_len + bench.response_len_max = {need}; "
            f"set engine.max_model_len>={need}."
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

    from rlgen.charvocab import CHAR_VOCAB_SIZE

    _check(cfg)
    b = cfg.bench
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = cfg.model.vocab_size or CHAR_VOCAB_SIZE
    requests = make_workload(b, vocab)
    machine = gpu_info()
    started_ray = False
    if not ray.is_initialized():
        ray.init(
            address=os.environ.get("RAY_ADDRESS", "local"),  # a cluster of its own unless one is named
            include_dashboard=False,
            log_to_driver=True,
            runtime_env={"env_vars": _env_vars()},
        )
        started_ray = True
    mem = MemorySampler()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command or " ".join(sys.argv),
        "machine": machine,
        "versions": versions(),
        "model": {"name": cfg.model.name, "vocab_size": vocab},
        "bench": asdict(b),
        "engine": {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(cfg.engine).items()},
        "workload": workload_summary(requests),
        "results": {},
    }
    try:
        t0 = time.time()
        model_path = _build_model(cfg)
        result["model"]["build_s"] = round(time.time() - t0, 1)
        result["model"]["path_is_local_build"] = cfg.model.path is None
        for side in b.engines:
            if side == "vllm":
                weights = _load_weights_cpu(model_path) if sync else None
                rec = run_vllm_side(
                    model_path,
                    cfg.engine,
                    requests,
                    mem,
                    env=engine_env(cfg),
                    engine_args=engine_args,
                    seed=cfg.seed,
                    repeats=repeats,
                    sync_weights=weights,
                )
                del weights
            elif side == "vllm_raw":
                rec = run_raw_side(model_path, requests, mem, seed=cfg.seed)
            else:
                rec = run_hf_side(
                    model_path,
                    requests,
                    mem,
                    vocab=vocab,
                    batch_rows=b.hf_batch_size,
                    gpu_gib=machine.get("gpu_memory_gib", 80.0),
                    seed=cfg.seed,
                    budget_s=hf_budget_s,
                )
            result["results"][side] = rec
            _write(out, result)
        result["ratios"] = ratios(result["results"])
    finally:
        mem.close()
        if started_ray:
            ray.shutdown()
    _write(out, result)
    print_table(result)
    return result


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
        "checks",
    ):
        t.add_column(col, justify="left" if col in ("engine", "checks") else "right")
    for name, r in result["results"].items():
        if "error" in r:
            t.add_row(name, "-", "-", "-", "-", "-", "-", f"[red]{r['error'][:80]}[/]")
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
def bench_app(cfg: Any) -> dict:
    """Hydra task for `rlgen bench`: results go to Hydra's run directory."""
    from hydra.core.hydra_config import HydraConfig

    from rlgen.config import to_run_config

    return run_bench(to_run_config(cfg), HydraConfig.get().runtime.output_dir)


def compose(overrides: list[str]) -> RunConfig:
    try:
        from rlgen.compose import compose_run_config
    except ImportError:
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir

        import rlgen
        from rlgen.config import register_configs, to_run_config

        register_configs()
        with initialize_config_dir(config_dir=str(Path(rlgen.__file__).parent / "conf"), version_base="1.3"):
            return to_run_config(hydra_compose("config", overrides))
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
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"bench.json written to {out_dir}")
    return 0


__all__ = [
    "BenchError",
    "RawVLLM",
    "bench_app",
    "check_completions",
    "hf_chunks",
    "make_workload",
    "response_lengths",
    "run_bench",
    "run_hf_side",
    "run_raw_side",
    "run_vllm_side",
    "workload_summary",
]

if __name__ == "__main__":
    sys.exit(main())
