"""The rlgen engines the bench compares, each in its own Ray actor: rlgen's vllm and hf (raw vLLM: bench.raw), and
what every side shares (actor environment, waits, a side's record)."""

from __future__ import annotations

import os
import time
from typing import Any

from rlgen.bench.gpu import BusySampler, MemorySampler, gpu_used_gib, wait_gpu_free
from rlgen.bench.workload import (
    ACTOR_TIMEOUT_S,
    GIB,
    HF_BUDGET_S,
    HF_LOGIT_BYTES,
    HF_MEMORY_FRACTION,
    BenchError,
    check_completions,
)
from rlgen.config import EngineConfig
from rlgen.engines.contract import ShutsDown, has
from rlgen.engines.registry import engine_spec
from rlgen.plan.memory import engine_part
from rlgen.types import GenRequest


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
    actor: Any, mem: MemorySampler, baseline: float, rec: dict[str, Any], graceful: bool
) -> dict[str, Any]:
    """Peak memory into rec, then the actor (or list of actors) stopped and the GPU waited for. graceful: the
    actors answer shutdown(), engines whose kind claims ShutsDown (or bench.raw's RawVLLM)."""
    import ray

    rec["peak_gpu_gib"] = round(max(mem.peak() - baseline, 0.0), 2)
    for a in actor if isinstance(actor, list) else [actor]:
        if graceful:  # stop vLLM's engine-core processes before the actor goes, so the GPU is freed
            try:
                ray.get(a.shutdown.remote(), timeout=120)
            except Exception:  # noqa: BLE001 - the actor may already be dead; it is killed next either way
                pass
        ray.kill(a)
    rec["teardown_s"] = round(wait_gpu_free(baseline), 1)
    return rec


def split_round_robin(requests: list[GenRequest], k: int) -> list[list[GenRequest]]:
    """Requests dealt to k engines in turn: each gets every k-th prompt, so long and short ones spread evenly."""
    return [requests[i::k] for i in range(k)]


def _generate_on(
    actors: list[Any], shards: list[list[GenRequest]], what: str, busy_gpu: BusySampler | None = None
) -> dict[str, Any]:
    """One generate call per engine, all at once: the wall time (the slowest engine's, seen by the driver),
    the engines' own span (first start to last end), the checks over every shard and, with busy_gpu, the
    GPU's busy percentage during the calls."""
    busy = [(a, s) for a, s in zip(actors, shards) if s]
    if busy_gpu is not None:
        busy_gpu.start()
    t1 = time.time()
    outs = _get([a.generate.remote(s) for a, s in busy], what)
    wall = time.time() - t1
    gpu_busy = busy_gpu.stop() if busy_gpu is not None else None
    spans = [span for o in outs for span in o.spans]
    chks = [check_completions(s, o.completions) for (_, s), o in zip(busy, outs)]
    return {
        "wall_s": wall,
        "engine_s": max(b for _, _, b in spans) - min(a for _, a, _ in spans),
        "tokens": sum(c["tokens"] for c in chks),
        "completions": sum(c["completions"] for c in chks),
        "n_ok": all(c["n_ok"] for c in chks),
        "lengths_ok": all(c["lengths_ok"] for c in chks),
        "logprobs_ok": all(c["logprobs_ok"] for c in chks),
        **({"gpu_busy_pct": gpu_busy} if gpu_busy is not None else {}),
    }


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
    per_gpu: int = 1,
    engine_cls: type | None = None,
    busy_gpu: BusySampler | None = None,
) -> dict[str, Any]:
    """rlgen's VLLMEngine in a Ray actor with tensor_parallel_size GPUs, as in production. ``extra`` names
    further workloads to run on the same engine afterwards (reported under "extra").

    per_gpu > 1 (tensor_parallel_size 1 only): that many engine actors share one GPU, each with 1/per_gpu of it
    and of the memory share (engine.gpu_memory_utilization, 0.9 when unset). They start at once (those
    without a stored KV-cache size measure it in turn); the requests are dealt round-robin and all engines
    generate at once. engine_cls replaces VLLMEngine (tests run a stand-in without a GPU);
    busy_gpu adds the GPU's busy percentage to each run."""
    if engine_cls is None:

        engine_cls = engine_spec("vllm").actor_class()

    k = max(1, int(per_gpu))
    engine = _engine_each(engine, k)
    baseline = gpu_used_gib() or 0.0
    mem.mark()
    t0 = time.time()
    actors: list[Any] = []  # filled as engines start, so a failed start still stops the ones before it
    rec: dict[str, Any] | None = None
    try:
        health = _start_vllm_engines(
            actors, engine_cls, model_path, engine, k, label=label, seed=seed, env=env,
            engine_args=engine_args,
        )
        rec = _vllm_record(label, t0, health, engine, k, engine_args)
        _run_vllm_repeats(rec, actors, requests, k, label=label, repeats=repeats, t0=t0, busy_gpu=busy_gpu)
        for name, reqs in (extra or {}).items():
            run = _generate_on(actors, split_round_robin(reqs, k), f"{label}: generate ({name})")
            rec.setdefault("extra", {})[name] = _summarise_runs([run])
        if sync_weights is not None:
            _sync_vllm_weights(rec, actors, sync_weights, label)
    except Exception as err:  # noqa: BLE001 - one side failing must not lose the others' numbers
        rec = _vllm_failed(rec, label, err)
    return _finish_side(actors, mem, baseline, rec, graceful=has(engine_spec("vllm"), ShutsDown))


def _engine_each(engine: EngineConfig, k: int) -> EngineConfig:
    """The config of each of k engines sharing one GPU: 1/k of its memory share (k = 1: engine as given)."""

    if k == 1:
        return engine
    if engine.tensor_parallel_size != 1:
        raise BenchError("bench.engines_per_gpu > 1 needs engine.tensor_parallel_size=1.")
    return engine_part(engine, k)


def _start_vllm_engines(
    actors: list[Any],
    engine_cls: type,
    model_path: str,
    engine: EngineConfig,
    k: int,
    *,
    label: str,
    seed: int,
    env: dict[str, str] | None,
    engine_args: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """k engine actors, appended to actors, started at once (engines sharing a GPU take turns only to measure
    their KV cache: rlgen.engines.vllm.kvcache); returns their health reports."""
    import ray

    for i in range(k):
        name = label if k == 1 else f"{label}{i}"
        actors.append(
            ray.remote(engine_cls)
            .options(
                num_gpus=engine.tensor_parallel_size / k,
                max_concurrency=4,
                runtime_env={"env_vars": _env_vars(env)},
            )
            .remote(model_path, engine, device="cuda", seed=seed + i, name=name, env=env,
                    engine_args=engine_args)
        )
    return _get([a.health.remote() for a in actors], f"{label}: engine start")


def _vllm_record(
    label: str,
    t0: float,
    health: list[dict[str, Any]],
    engine: EngineConfig,
    k: int,
    engine_args: dict[str, Any] | None,
) -> dict[str, Any]:
    """The vllm side's record once its engines are up: start times and the settings they run with."""
    rec: dict[str, Any] = {
        "engine": label,
        "start_s": round(time.time() - t0, 1),
        "engine_start_s": round(max(h["start_s"] for h in health), 1),  # they start at once: the slowest
        "kv_size": [h.get("kv_size") for h in health],
    }
    if k > 1:
        rec["engines_per_gpu"] = k
        rec["gpu_memory_utilization_each"] = engine.gpu_memory_utilization
    rec["engine_args"] = dict(engine_args or {})
    return rec


def _run_vllm_repeats(
    rec: dict[str, Any],
    actors: list[Any],
    requests: list[GenRequest],
    k: int,
    *,
    label: str,
    repeats: int,
    t0: float,
    busy_gpu: BusySampler | None,
) -> None:
    """The workload, dealt round-robin to the engines, repeats times (at least once); the runs go into rec,
    and first_batch_s (from t0) once the first run is back."""
    shards = split_round_robin(requests, k)
    runs = []
    for i in range(max(1, repeats)):
        runs.append(_generate_on(actors, shards, f"{label}: generate", busy_gpu))
        if i == 0:
            rec["first_batch_s"] = round(time.time() - t0, 1)
    rec.update(_summarise_runs(runs))


def _sync_vllm_weights(rec: dict[str, Any], actors: list[Any], weights: dict[str, Any], label: str) -> None:
    """One weight update on every engine, timed into rec["sync"]; it says "not finished" until the update is."""
    import ray

    rec["sync"] = {"error": "not finished"}
    t1 = time.time()
    ref = ray.put(weights)
    ups = _get([a.update_weights.remote(ref, 1) for a in actors], f"{label}: update_weights")
    rec["sync"] = {
        "engine_s": round(max(u["seconds"] for u in ups), 2),
        "driver_s": round(time.time() - t1, 2),
        "gib": round(ups[0]["bytes"] / GIB, 2),
        "tensors": ups[0]["tensors"],
        "prefix_cache_reset": all(u["prefix_cache_reset"] for u in ups),
    }


def _vllm_failed(rec: dict[str, Any] | None, label: str, err: Exception) -> dict[str, Any]:
    """The record after err: a failed weight update keeps the generation numbers before it; anything else
    leaves only the error."""
    msg = f"{type(err).__name__}: {err}"
    if rec is not None and rec.get("sync") == {"error": "not finished"}:
        rec["sync"] = {"error": msg[-2000:]}  # generation finished; keep its numbers
        return rec
    return {"engine": label, "error": msg[-2000:]}


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

    HFEngine = engine_spec("hf").actor_class()  # noqa: N806 - the class, as the registry holds it

    baseline = gpu_used_gib() or 0.0
    mem.mark()
    t0 = time.time()
    cfg = EngineConfig(kind="hf", dtype="bfloat16", max_num_seqs=batch_rows)
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
            ((phase, a, b),) = res.spans
            runs.append({"wall_s": wall, "engine_s": b - a, **check_completions(chunk, res.completions)})
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
    return _finish_side(actor, mem, baseline, rec, graceful=has(engine_spec("hf"), ShutsDown))


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
        for k in ("tokens", "wall_s", "engine_s", "tokens_per_s", "n_ok", "lengths_ok", "logprobs_ok", "gpu_busy_pct")
        if k in first
    }
    out["engine_tokens_per_s"] = round(first["tokens"] / first["engine_s"], 1) if first["engine_s"] else 0.0
    if len(per) > 1:
        out["runs"] = per
    return out


# -- the whole bench -----------------------------------------------------------------------------------------
