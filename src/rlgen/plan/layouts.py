"""The layouts one hardware can run a config in, each built as a plan and given its predicted step, fastest first.

A layout is where engines sit and how wide they are: hybrid (``hardware.colocated=true``: a learner rank and
engines on every GPU) or split (engines on ``hardware.engine_gpus``, learners on the rest), at tensor parallel 1
or 2; engines per GPU are left to the plan in each. Each candidate is the user's config with only those keys set,
so everything else the user typed holds. The prediction is the roofline planner's (``plan.prediction``): its
decode overhead is calibrated on vLLM, but its learner MFU comes from a bare optimizer step, 3-5x above what
rlgen's learner reached at 1.5B (docs/benchmarks.md, "Every GPU busy"). ``rlgen plan`` shows the ranking, computed
once per command by ``plan.preflight``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlgen.config import RunConfig, set_key
from rlgen.plan.layout import Plan, PlanError
from rlgen.plan.prediction import predict


@dataclass(frozen=True)
class LayoutOption:
    label: str  # "hybrid, TP 1" or "split 2+2, TP 1" (engine GPUs + learner GPUs)
    overrides: tuple[str, ...]  # what to type for it
    step_s: float | None = None  # predicted; None where the layout does not build or has no prediction
    gen_s: float = 0.0
    train_s: float = 0.0
    engines: int = 0
    why: str = ""  # the first problem where it does not build, or why there is no prediction
    current: bool = False  # the plan's own layout


def _candidates(cfg: RunConfig, tp_sizes: tuple[int, ...]) -> list[tuple[str, dict]]:
    """(label, {key: value}) for every layout this hardware could hold."""
    hw = cfg.hardware
    total = hw.nodes * hw.gpus_per_node
    out: list[tuple[str, dict]] = []
    for tp in tp_sizes:
        out.append((f"hybrid, TP {tp}", {"hardware.colocated": True, "engine.tensor_parallel_size": tp}))
    for tp in tp_sizes:
        for engine_gpus in range(tp, total, tp):
            keys = {"hardware.colocated": False, "engine.tensor_parallel_size": tp, "hardware.engine_gpus": engine_gpus,
                    "hardware.learner_gpus": total - engine_gpus}
            out.append((f"split {engine_gpus}+{total - engine_gpus}, TP {tp}", keys))
    return out


def _typed(key: str, value: object) -> str:
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


def _is_current(plan: Plan, keys: dict) -> bool:
    hw = plan.config.hardware
    if plan.colocated != keys["hardware.colocated"]:
        return False
    if plan.engines and plan.engines[0].tensor_parallel_size != keys["engine.tensor_parallel_size"]:
        return False
    return plan.colocated or hw.engine_gpus == keys["hardware.engine_gpus"]


def layout_options(cfg: RunConfig, plan: Plan) -> list[LayoutOption]:
    """Every layout of ``plan``'s hardware for ``cfg`` (the config as the user gave it), the ones that build
    fastest first by predicted step, then the others with why. Empty on CPU, on one GPU, or where the engine kind
    has no prediction (a single layout, or nothing to rank)."""
    from rlgen.plan.build import build_plan

    hw = plan.config.hardware
    if plan.device != "cuda" or hw.nodes * hw.gpus_per_node < 2 or not predict(plan).available:
        return []
    base = dataclasses.replace(cfg, hardware=hw)  # hardware=auto: the preset it found
    tps = (1, 2) if plan.engine.tensor_parallel and hw.gpus_per_node >= 2 else (1,)
    options = []
    for label, keys in _candidates(base, tps):
        typed = tuple(_typed(k, v) for k, v in keys.items())
        one = base
        for key, value in keys.items():
            one = set_key(one, key, value)
        try:
            built = build_plan(one)
        except PlanError as err:
            options.append(LayoutOption(label, typed, why=err.problems[0] if err.problems else "does not build"))
            continue
        except Exception as err:  # noqa: BLE001 - a layout that cannot be weighed is listed, never fatal
            options.append(LayoutOption(label, typed, why=f"could not be planned: {err}"))
            continue
        pred = predict(built)
        options.append(LayoutOption(label, typed, pred.step_s if pred.available else None, pred.gen_s, pred.train_s,
                                    len(built.engines), "" if pred.available else pred.reason,
                                    current=_is_current(plan, keys)))
    ranked = sorted((o for o in options if o.step_s is not None), key=lambda o: o.step_s)
    return ranked + [o for o in options if o.step_s is None]


def faster_layout_line(options: list[LayoutOption]) -> str | None:
    """One sentence when a layout other than the plan's is predicted faster, with what to type; None otherwise."""
    ranked = [o for o in options if o.step_s]
    mine = next((o for o in ranked if o.current), None)
    if not ranked or mine is None or ranked[0] is mine or ranked[0].step_s >= mine.step_s:
        return None
    best = ranked[0]
    return (f"{best.label} is predicted {mine.step_s / best.step_s:.1f}x faster a step than this plan's {mine.label} "
            f"({best.step_s:.1f} s against {mine.step_s:.1f} s); to try it, add: {' '.join(best.overrides)}")


__all__ = ["LayoutOption", "faster_layout_line", "layout_options"]
