"""The engines a generation-bound step's advice may add or move, and the larger hardware it may name, from what the
plan found the hardware has room for (BalanceContext's room fields). Pure Python."""

from __future__ import annotations

import math

from rlgen.metrics.balance_context import BalanceContext

MAX_ENGINE_GROWTH = 16  # past this, "add N engines" stops being useful advice


def more_engines(n: int, ratio: float, ctx: BalanceContext, fixes: list[str]) -> str:
    """Generation-bound: the engines to add that the hardware has room for (into fixes); returns the "with more
    GPUs" clause for what it has no room for ("" when all fits, or on CPU)."""
    known = ctx.device == "cuda" and ctx.free_gpus is not None
    if not (math.isfinite(ratio) and ratio <= MAX_ENGINE_GROWTH):
        if not known:
            fixes.append(f"add engines (it would take over {MAX_ENGINE_GROWTH}x the {n} there are)")
            return ""
        fixes += _more_per_gpu(ctx)
        return with_more_gpus(ctx, f"over {MAX_ENGINE_GROWTH}x the {n} engines there are", 10**9)
    add = max(1, math.ceil(n * ratio - 1e-9) - n)
    if not known:
        gpus = f": {(n + add) * ctx.tensor_parallel_size} engine GPUs" if ctx.device == "cuda" else ""
        fixes.append(f"add {add} engine{'s' if add > 1 else ''} (engine.num_engines={n + add}{gpus})")
        return ""
    fit = min(add, ctx.free_gpus // max(ctx.tensor_parallel_size, 1))
    if fit:
        fixes.append(f"add {fit} engine{'s' if fit > 1 else ''} on the idle GPUs (engine.num_engines={n + fit})")
    tp = max(ctx.tensor_parallel_size, 1)
    move = min(add - fit, (ctx.learner_gpus - 1) // tp) * tp  # learners keep at least one GPU
    if move > 0:
        fixes.append(f"move {move} GPUs from the learners to the engines (hardware.engine_gpus="
                     f"{ctx.engine_gpus + move}, hardware.learner_gpus={ctx.learner_gpus - move}, "
                     f"engine.num_engines={n + fit + move // tp})")
    if fit < add:
        fixes += _more_per_gpu(ctx)
    if fit >= add:
        return ""
    need = (n + add) * tp
    return with_more_gpus(ctx, f"engine.num_engines={n + add}, {need} engine GPUs", need)


def _more_per_gpu(ctx: BalanceContext) -> list[str]:
    """One more engine per GPU, where the plan found it fits; [] where it does not."""
    k = ctx.engines_per_gpu_next
    return [f"run {k} engines per GPU (engine.engines_per_gpu={k}), which keeps a GPU busier"] if k else []


def with_more_gpus(ctx: BalanceContext, change: str, need: int = 0) -> str:
    """'with more GPUs: hardware=<preset> <change>': the smallest preset with more GPUs (and at least `need` of
    them, when one has); "" on CPU or when there is none."""
    if ctx.device != "cuda" or not ctx.bigger_hardware:
        return ""
    name = next((h for h, g in ctx.bigger_hardware if g >= need), ctx.bigger_hardware[-1][0])
    return f"with more GPUs: hardware={name} ({change})"


__all__ = ["MAX_ENGINE_GROWTH", "more_engines", "with_more_gpus"]
