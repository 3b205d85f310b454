"""The raw side of `rlgen bench`: vLLM's own offline ``LLM`` on the same requests, with no rlgen around it, in a Ray
actor with the GPU (vllm is imported inside the actor)."""

from __future__ import annotations

import time
from typing import Any

from rlgen.bench.gpu import BusySampler, MemorySampler, gpu_used_gib
from rlgen.bench.sides import _env_vars, _finish_side, _get, _summarise_runs
from rlgen.bench.workload import check_completions
from rlgen.generated import GenResult
from rlgen.types import Completion, GenRequest


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

    def generate(self, requests: list[GenRequest], logprobs: int | None = 0) -> GenResult:
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
        return GenResult(completions=completions, version=0, spans=[("generate", t0, t1)])


# -- running one side ----------------------------------------------------------------------------------------
def run_raw_side(
    model_path: str,
    requests: list[GenRequest],
    mem: MemorySampler,
    *,
    seed: int = 0,
    llm_kwargs: dict[str, Any] | None = None,
    logprobs_variants: tuple[int | None, ...] = (0,),
    label: str = "vllm_raw",
    env: dict[str, str] | None = None,
    busy_gpu: BusySampler | None = None,
) -> dict[str, Any]:
    """vllm.LLM with default settings in a Ray actor with one GPU; one run per logprobs setting (a setting
    given again is a repeat: every run is kept under "runs")."""
    import ray

    baseline = gpu_used_gib() or 0.0
    mem.mark()
    t0 = time.time()
    actor = (
        ray.remote(RawVLLM)
        .options(num_gpus=1, runtime_env={"env_vars": _env_vars(env)})
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
            if busy_gpu is not None:
                busy_gpu.start()
            t1 = time.time()
            res = _get(actor.generate.remote(requests, lp), f"{label}: generate")
            wall = time.time() - t1
            gpu_busy = busy_gpu.stop() if busy_gpu is not None else None
            if i == 0:
                rec["first_batch_s"] = round(time.time() - t0, 1)
            ((phase, a, b),) = res.spans
            chk = check_completions(requests, res.completions)
            if lp is None:
                chk["logprobs_ok"] = None
            run = {"wall_s": wall, "engine_s": b - a, **chk}
            if gpu_busy is not None:
                run["gpu_busy_pct"] = gpu_busy
            if i == 0:
                rec.update(_summarise_runs([run]))
            else:
                rec[f"logprobs_{lp}"] = _summarise_runs([run])
            rec.setdefault("runs", []).append({"logprobs": lp, "wall_s": round(wall, 3),
                                               "tokens_per_s": round(chk["tokens"] / wall, 1),
                                               **({"gpu_busy_pct": gpu_busy} if gpu_busy is not None else {})})
    except Exception as err:  # noqa: BLE001
        rec = {"engine": label, "error": f"{type(err).__name__}: {err}"}
    return _finish_side(actor, mem, baseline, rec, graceful=True)  # RawVLLM.shutdown() stops vLLM's engine core
