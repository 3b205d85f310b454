"""The layouts one hardware can run a config in, each built as a plan and given its predicted step, fastest first;
and the plan's own pick where the config leaves the layout null.

A layout is where engines sit and how wide they are: hybrid (``hardware.colocated=true``: a learner rank and
engines on every GPU) or split (engines on ``hardware.engine_gpus``, learners on the rest), at tensor parallel 1
or 2 (and the config's own size); engines per GPU are left to the plan in each. Each candidate is the user's
config with only those keys set, so everything else the user typed holds. The prediction is the roofline
planner's (``plan.prediction``), its decode overhead and learner calibrated on rlgen's own runs. ``build_plan``
calls ``choose_layout`` where any layout key is null (the multi-GPU presets); ``rlgen plan`` shows the ranking,
computed once per command (the chosen plan carries it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from rlgen.config import RunConfig, Setting, get_key, set_key
from rlgen.engines.registry import EngineSpec
from rlgen.plan.prediction import predict
from rlgen.plan.resolved import Choice, Plan, PlanError

Build = Callable[..., Plan]  # plan.build.build_plan(cfg, runnable=...)


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


def layout_label(colocated: bool, tp: int, engine_gpus: int = 0, learner_gpus: int = 0) -> str:
    """A layout in words: "hybrid, TP 1" or "split 2+2, TP 1" (engine GPUs + learner GPUs)."""
    return f"hybrid, TP {tp}" if colocated else f"split {engine_gpus}+{learner_gpus}, TP {tp}"


def _candidates(cfg: RunConfig, tp_sizes: tuple[int, ...]) -> list[tuple[str, dict]]:
    """(label, {key: value}) for every layout this hardware could hold."""
    hw = cfg.hardware
    total = hw.nodes * hw.gpus_per_node
    out: list[tuple[str, dict]] = []
    for tp in tp_sizes:
        out.append((layout_label(True, tp), {"hardware.colocated": True, "engine.tensor_parallel_size": tp,
                                         "hardware.engine_gpus": total, "hardware.learner_gpus": total}))
    for tp in tp_sizes:
        for engine_gpus in range(tp, total, tp):
            keys = {"hardware.colocated": False, "engine.tensor_parallel_size": tp, "hardware.engine_gpus": engine_gpus,
                    "hardware.learner_gpus": total - engine_gpus}
            out.append((layout_label(False, tp, engine_gpus, total - engine_gpus), keys))
    return out


def _typed(key: str, value: object) -> str:
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


def _shown(keys: dict) -> tuple[str, ...]:
    """What to type for a layout: a hybrid one needs no GPU counts."""
    return tuple(_typed(k, v) for k, v in keys.items()
                 if not (keys["hardware.colocated"] and k in ("hardware.engine_gpus", "hardware.learner_gpus")))


def _is_current(plan: Plan, keys: dict) -> bool:
    hw = plan.config.hardware
    if plan.colocated != keys["hardware.colocated"]:
        return False
    if plan.engines and plan.engines[0].tensor_parallel_size != keys["engine.tensor_parallel_size"]:
        return False
    return plan.colocated or hw.engine_gpus == keys["hardware.engine_gpus"]


def _tp_sizes(cfg: RunConfig, spec) -> tuple[int, ...]:
    """TP 1 and 2 where the engine kind shards and a node has two GPUs, and the config's own TP size."""
    sizes = {1, 2} if spec.tensor_parallel and cfg.hardware.gpus_per_node >= 2 else {1}
    return tuple(sorted(sizes | {max(cfg.engine.tensor_parallel_size, 1)}))


def _weigh(base: RunConfig, candidates: list[tuple[str, dict]], build: Build, runnable: bool = True
           ) -> list[tuple[LayoutOption, dict, Plan | None, list[str]]]:
    """Each candidate built (by ``build``, plan.build.build_plan) and predicted: (option, its keys, its plan or
    None, its problems)."""
    out = []
    for label, keys in candidates:
        typed = _shown(keys)
        try:
            built = build(_with_keys(base, keys), runnable=runnable)
        except PlanError as err:
            why = err.problems[0] if err.problems else "does not build"
            out.append((LayoutOption(label, typed, why=why), keys, None, list(err.problems)))
            continue
        except Exception as err:  # noqa: BLE001 - a layout that cannot be weighed is listed, never fatal
            out.append((LayoutOption(label, typed, why=f"could not be planned: {err}"), keys, None, [str(err)]))
            continue
        pred = predict(built)
        option = LayoutOption(label, typed, pred.step_s if pred.available else None, pred.gen_s, pred.train_s,
                              len(built.engines), "" if pred.available else pred.reason)
        out.append((option, keys, built, []))
    return out


def _ranked(options: list[LayoutOption]) -> list[LayoutOption]:
    """Those with a predicted step, fastest first, then the others."""
    return sorted((o for o in options if o.step_s is not None), key=lambda o: o.step_s) + \
        [o for o in options if o.step_s is None]


def layout_options(cfg: RunConfig, plan: Plan, build: Build) -> list[LayoutOption]:
    """Every layout of ``plan``'s hardware for ``cfg`` (the config as the user gave it), the ones that build
    fastest first by predicted step, then the others with why. Empty on CPU, on one GPU, or where the engine kind
    has no prediction (a single layout, or nothing to rank). A plan whose layout the plan chose carries them."""
    if plan.layout_ranking:
        return list(plan.layout_ranking)
    hw = plan.config.hardware
    if plan.device != "cuda" or hw.nodes * hw.gpus_per_node < 2 or not predict(plan).available:
        return []
    base = dataclasses.replace(cfg, hardware=hw)  # hardware=auto: the preset it found
    weighed = _weigh(base, _candidates(base, _tp_sizes(base, plan.engine)), build)
    return _ranked([dataclasses.replace(o, current=_is_current(plan, keys)) for o, keys, _, _ in weighed])


# -- the plan's own choice ----------------------------------------------------------------------------------


def layout_open(cfg: RunConfig) -> bool:
    """The config leaves some of the layout to the plan: any of hardware.colocated, engine_gpus and learner_gpus
    unset (null)."""
    hw = cfg.hardware
    return hw.colocated is None or hw.engine_gpus is None or hw.learner_gpus is None


def _agrees(cfg: RunConfig, keys: dict) -> bool:
    """A candidate keeps what the user typed: the engine's TP, and hardware.colocated=false if given."""
    return keys["engine.tensor_parallel_size"] == cfg.engine.tensor_parallel_size and not (
        cfg.hardware.colocated is False and keys["hardware.colocated"])


def _fixed(cfg: RunConfig, spec) -> dict | None:
    """The one layout where there is nothing to choose: CPU actors, one GPU, a server's engines, hybrid asked
    for, or GPU counts given (the other count is the rest of the GPUs)."""
    hw = cfg.hardware
    total = hw.nodes * hw.gpus_per_node
    if hw.gpus_per_node == 0 or spec.served:
        return {"hardware.colocated": False, "hardware.engine_gpus": 0 if spec.served else hw.engine_gpus or 0,
                "hardware.learner_gpus": total if spec.served else hw.learner_gpus or 0}
    if total == 1 or cfg.engine.colocate or hw.colocated:
        return {"hardware.colocated": True, "hardware.engine_gpus": total, "hardware.learner_gpus": total}
    if hw.engine_gpus is not None or hw.learner_gpus is not None:
        engines = hw.engine_gpus if hw.engine_gpus is not None else total - hw.learner_gpus
        learners = hw.learner_gpus if hw.learner_gpus is not None else total - hw.engine_gpus
        return {"hardware.colocated": False, "hardware.engine_gpus": engines, "hardware.learner_gpus": learners}
    return None


def _with_keys(cfg: RunConfig, keys: dict) -> RunConfig:
    for key, value in keys.items():
        cfg = set_key(cfg, key, value)
    return cfg


def choose_layout(cfg: RunConfig, spec: EngineSpec, build: Build, runnable: bool = True) -> Plan:
    """The plan in the layout predicted fastest among those that keep what the user typed (the engine's TP, and
    any of hardware.colocated / engine_gpus / learner_gpus given). Where no layout has a prediction (an engine
    kind without one), engines get half the GPUs. The plan carries every layout's ranking (rlgen plan). ``build``
    is plan.build.build_plan, which calls this where the config leaves the layout open."""
    fixed = _fixed(cfg, spec)
    if fixed is not None:  # fill only what the config left null
        return build(_with_keys(cfg, {k: v for k, v in fixed.items() if get_key(cfg, k) is None}), runnable=runnable)
    weighed = _weigh(cfg, _candidates(cfg, _tp_sizes(cfg, spec)), build, runnable)
    mine = [w for w in weighed if _agrees(cfg, w[1])]
    total = cfg.hardware.nodes * cfg.hardware.gpus_per_node
    if not mine:  # a TP size no GPU count of this hardware divides: the plan of half the GPUs says why
        return build(_with_keys(cfg, {"hardware.colocated": False, "hardware.engine_gpus": total // 2,
                                           "hardware.learner_gpus": total - total // 2}), runnable=runnable)
    built = [w for w in mine if w[2] is not None]
    predicted = sorted((w for w in built if w[0].step_s is not None), key=lambda w: w[0].step_s)
    half = next((w for w in mine if not w[1]["hardware.colocated"] and w[1]["hardware.engine_gpus"] * 2 >= total),
                mine[0])
    predicted, lora_only = _whole_model_first(cfg, predicted)
    if predicted:
        best, why = predicted[0], _why_fastest(predicted, bool(lora_only))
    elif built:
        best = half if half[2] is not None else built[0]
        why = "derived: no layout has a predicted step (engine kind without a prediction); engines get half the GPUs"
    else:
        raise PlanError(half[3] or [half[0].why])
    option, keys, plan, _ = best
    settings = tuple(Setting(k, v, why) for k, v in keys.items() if k != "engine.tensor_parallel_size"
                     and not (keys["hardware.colocated"] and k != "hardware.colocated"))
    choice = Choice("layout", option.label, why, tuple((w[0].label, w[0].why or (LORA_ONLY if w in lora_only else (
        f"predicted {w[0].step_s:.1f} s a step against {option.step_s:.1f} s" if w[0].step_s is not None else "")))
        for w in mine if w is not best) + ((option.label, ""),))
    ranking = tuple(_ranked([dataclasses.replace(w[0], current=w is best) for w in weighed]))
    return dataclasses.replace(plan, settings=settings + plan.settings, choices=plan.choices + (choice,),
                               layout_ranking=ranking)


LORA_ONLY = "trains only LoRA adapters: full fine-tuning does not fit it"


def _whole_model_first(cfg: RunConfig, predicted: list) -> tuple[list, list]:
    """(the predicted layouts to pick from, those left out): where learner.lora.enabled is left null and some
    layout trains the whole model, the layouts that derived LoRA are left out. LoRA is derived only where full
    fine-tuning fits no layout of this hardware: it trains something else, not the same thing faster."""
    whole = [w for w in predicted if not w[2].config.learner.lora.enabled]
    if cfg.learner.lora.enabled is not None or not whole:
        return predicted, []
    return whole, [w for w in predicted if w not in whole]


def _why_fastest(predicted: list, whole_only: bool = False) -> str:
    best = predicted[0][0]
    of = " of those that train the whole model" if whole_only else ""
    text = f"derived: the layout predicted fastest{of} ({best.label}, {best.step_s:.1f} s a step"
    if len(predicted) > 1:
        nxt = predicted[1][0]
        text += f"; next {nxt.label}, {nxt.step_s:.1f} s"
    if whole_only:
        text += "; those with LoRA adapters only are left out, learner.lora.enabled=true lets them in"
    return text + "; rlgen plan ranks them)"


def faster_layout_line(options: list[LayoutOption]) -> str | None:
    """One sentence when a layout other than the plan's is predicted faster, with what to type; None otherwise."""
    ranked = [o for o in options if o.step_s]
    mine = next((o for o in ranked if o.current), None)
    if not ranked or mine is None or ranked[0] is mine or ranked[0].step_s >= mine.step_s:
        return None
    best = ranked[0]
    return (f"{best.label} is predicted {mine.step_s / best.step_s:.1f}x faster a step than this plan's {mine.label} "
            f"({best.step_s:.1f} s against {mine.step_s:.1f} s); to try it, add: {' '.join(best.overrides)}")


__all__ = ["LORA_ONLY", "LayoutOption", "choose_layout", "faster_layout_line", "layout_label", "layout_open", "layout_options"]
