"""RunConfig -> Plan: the one judge of what runs where, built once per command.

A pure function of the config: no torch, no Ray, no GPU (``hardware=auto`` alone reads this machine's GPUs from
nvidia-smi, plan.checks.cards). It resolves what the config leaves open (the engine's
spec, the learner kind, the layout, every null value from the recipe or the memory model, each engine's memory
share, the weight path) into typed fields, and runs every check that spans several fields, before anything
launches. Each failure says how to fix it; all problems are reported at once.
"""

from __future__ import annotations

import dataclasses

from rlgen.algo.registry import algorithm_problems
from rlgen.config import LoraSync, RunConfig, Setting, Transport, set_key
from rlgen.engines.registry import EngineSpec, UnknownEngineKind, engine_spec
from rlgen.learners.registry import resolve_learner
from rlgen.plan.attention import resolve_attention
from rlgen.plan.checks.cards import AUTO, auto_hardware, found, preset_for, visible_gpus
from rlgen.plan.checks.episodes import check_engine_plays_episodes, check_episodes
from rlgen.plan.checks.ignored import check_ignored
from rlgen.plan.checks.spanning import (
    check_hardware,
    check_learners,
    check_lengths,
    check_micro_batch,
    check_partial_rollouts,
    check_shaped_lengths,
    hardware_problems,
    live_vllm_env,
)
from rlgen.plan.checks.values import check_values, once_per_nonfinite
from rlgen.plan.context import fill_context
from rlgen.plan.determinism import determinism_problems, resolve_determinism
from rlgen.plan.disk import disk_writes
from rlgen.plan.env_bound import env_time_notes
from rlgen.plan.headroom import hardware_room
from rlgen.plan.kv_cache import size_kv_cache
from rlgen.plan.lora import resolve_lora
from rlgen.plan.memory import GIB, adapter_params, response_bound, share_part
from rlgen.plan.mesh import resolve_mesh
from rlgen.plan.model_folder import with_model_folder
from rlgen.plan.overlap import default_async_steps, fit_with_overlap
from rlgen.plan.params import count_params
from rlgen.plan.precision import resolve_precision
from rlgen.plan.recipes import fill_recipe
from rlgen.plan.resolved import BatchGeometry, Choice, EngineSlot, Layout, ModelSummary, Plan, PlanError
from rlgen.plan.slots import default_engines_per_gpu, place_engines, place_learners
from rlgen.plan.task_bounds import fill_task_bounds
from rlgen.plan.teacher import teacher_plan, teacher_problems, with_teacher


def model_summary(cfg: RunConfig) -> ModelSummary:
    m = cfg.model
    params, vocab = count_params(m)
    head_dim = m.hidden_size // max(m.num_heads, 1)
    kv_per_token = 2 * m.num_layers * m.num_kv_heads * head_dim * 2
    return ModelSummary(m.name, params, vocab, params * 2 / GIB, kv_per_token)


def spec_of(cfg: RunConfig) -> EngineSpec:
    """engine.kind's spec; PlanError when there is no such kind."""
    try:
        return engine_spec(cfg.engine.kind)
    except UnknownEngineKind as err:
        raise PlanError([str(err)]) from None


def layout_of(cfg: RunConfig, spec: EngineSpec) -> Layout:
    if spec.served:
        return Layout.served  # a server's engines share nothing with the learners, whatever the preset says
    if cfg.hardware.gpus_per_node == 0:
        return Layout.cpu
    return Layout.colocated if (cfg.engine.colocate or cfg.hardware.colocated) else Layout.split


def transport_of(cfg: RunConfig, spec: EngineSpec, layout: Layout) -> Transport:
    if cfg.learner.lora.enabled and LoraSync(cfg.learner.lora.sync) is LoraSync.adapter:
        return Transport.lora_adapter
    if layout is Layout.cpu:
        return Transport.ray_object_store
    return spec.transport(layout is Layout.colocated, cfg)


def _with_found_hardware(cfg: RunConfig, runnable: bool) -> Plan:
    """hardware=auto: the plan for this machine's GPUs, with what was found first in its settings."""
    from rlgen.config.compose import group_options

    gpus = visible_gpus()
    hw = auto_hardware(gpus)
    preset = preset_for(gpus, group_options("hardware"))
    named = f"{AUTO}:{preset or (f'{len(gpus)}x{hw.gpu.name}' if gpus else 'cpu')}"
    plan = build_plan(dataclasses.replace(cfg, hardware=dataclasses.replace(hw, name=named)), runnable=runnable)
    hw = plan.config.hardware  # its layout as the plan chose it
    layout = (f"{hw.gpus_per_node} x {hw.gpu.name}: " + ("engines and learners share them" if hw.colocated else
              f"{hw.engine_gpus} for engines, {hw.learner_gpus} for learners") if gpus else "CPU actors")
    why = f"detected: {found(gpus)} on this machine" + (f", the GPUs hardware={preset} is made for" if preset else "")
    return dataclasses.replace(plan, settings=(Setting("hardware", layout, why), *plan.settings))


def _resolve(cfg: RunConfig, spec: EngineSpec) -> tuple[RunConfig, list[Setting]]:
    """The model folder's shape, the recipe's values, what the engine kind resolves (a server's engines) and
    the engine's max_model_len; raises PlanError when the engine kind cannot resolve."""
    p: list[str] = []
    check_engine_plays_episodes(cfg, spec, p)  # known from the kind alone: said before a server is asked
    if p:
        raise PlanError(p)
    given_yarn = cfg.model.yarn_factor
    cfg = with_model_folder(cfg)
    params, vocab = count_params(cfg.model)
    cfg, settings = fill_recipe(cfg, params)
    cfg, context = fill_context(cfg, given_yarn, p)
    if p:
        raise PlanError(p)
    cfg, bounds = fill_task_bounds(cfg)
    settings += context + bounds
    if spec.resolve is not None:
        cfg, resolved = spec.resolve(cfg, params, vocab, p)
        if p:
            raise PlanError(p)
        settings += resolved
    if cfg.algo.overlong_buffer is None:  # DAPO's buffer: 4k of a 20k response limit
        buffer = cfg.algo.max_new_tokens // 5
        cfg = set_key(cfg, "algo.overlong_buffer", buffer)
        settings.append(Setting("algo.overlong_buffer", buffer, "derived: algo.max_new_tokens / 5"))
    if cfg.engine.max_model_len is None:
        name, resp = response_bound(cfg)
        need = cfg.task.max_prompt_tokens + resp
        cfg = set_key(cfg, "engine.max_model_len", need)
        settings.append(Setting("engine.max_model_len", need, f"derived: task.max_prompt_tokens + {name}"))
    return cfg, settings


def _batch(cfg: RunConfig, ranks: int, has_learners: bool, p: list[str]) -> BatchGeometry:
    a = cfg.algo
    seqs = a.prompts_per_step * a.samples_per_prompt
    if has_learners and seqs < ranks and min(a.prompts_per_step, a.samples_per_prompt) > 0:  # else: check_values
        p.append(f"the batch of {seqs} sequences (algo.prompts_per_step={a.prompts_per_step} x "
                 f"algo.samples_per_prompt={a.samples_per_prompt}) cannot give each of {ranks} learner ranks a "
                 f"sequence; raise algo.prompts_per_step to {-(-ranks // a.samples_per_prompt)} or more.")
    # ranks get equal work, not equal rows (rlgen.microbatches): the most a rank gets is about its share
    per_rank = -(-seqs // ranks) if has_learners and seqs >= ranks else 0
    return BatchGeometry(a.prompts_per_step, a.samples_per_prompt, seqs, ranks, per_rank, cfg.task.max_prompt_tokens,
                         a.max_new_tokens, cfg.task.max_prompt_tokens + response_bound(cfg)[1])


def _shares(engines: tuple[EngineSlot, ...], cfg: RunConfig, spec: EngineSpec) -> tuple[EngineSlot, ...]:
    """Each engine's part of its GPU's memory: the engines' share, split between the engines on one GPU."""
    share = cfg.engine.gpu_memory_utilization if spec.memory_share and cfg.hardware.gpus_per_node else None
    if share is None:
        return engines
    return tuple(dataclasses.replace(e, memory_share=share_part(share, e.per_gpu)) for e in engines)


def build_plan(cfg: RunConfig, *, runnable: bool = True) -> Plan:
    """Resolve and check a RunConfig. Raises PlanError listing every problem with its fix.

    runnable=False checks the geometry only (placement, batch, lengths), not whether the learner kind can train
    the plan's ranks: the placement tests use it to place every layout, whichever learner would train it."""
    if cfg.hardware.name == AUTO:
        return _with_found_hardware(cfg, runnable)
    if broken := hardware_problems(cfg):
        raise PlanError(broken)
    from rlgen.plan.layouts import choose_layout, layout_open  # noqa: I001 - lazy: prediction imports the plan

    if layout_open(cfg):  # the hardware leaves the layout to the plan: the one predicted fastest
        return choose_layout(cfg, spec_of(cfg), build_plan, runnable)
    if cfg.engine.engines_per_gpu is None:
        return _with_engines_per_gpu(cfg, runnable)
    spec = spec_of(cfg)
    cfg, settings = _resolve(cfg, spec)
    p: list[str] = []
    p.extend(algorithm_problems(cfg.algo))
    check_values(cfg, p)
    cfg = with_teacher(cfg)
    teacher_problems(cfg, p)
    cfg, precision = resolve_precision(cfg, p)
    settings += precision
    cfg, determinism = resolve_determinism(cfg, spec)
    determinism_problems(cfg, p)
    layout = layout_of(cfg, spec)
    derived_async = default_async_steps(cfg, spec, layout is Layout.colocated) if cfg.algo.async_steps is None else None
    if derived_async:
        cfg = set_key(cfg, "algo.async_steps", derived_async.value)
    check_hardware(cfg, spec, layout, p)
    engines = place_engines(cfg, spec, layout, p)
    learners = place_learners(cfg, layout, p)
    device = "cuda" if cfg.hardware.gpus_per_node else "cpu"
    learner = resolve_learner(cfg.learner.kind, device)
    if runnable:
        check_learners(cfg, learner, learners, p)
    cfg, attention = resolve_attention(cfg, device, learner, p)
    settings.append(attention)
    ms = model_summary(cfg)
    cfg, mesh, long_rows = resolve_mesh(cfg, spec, ms, len(learners), layout is Layout.colocated, learner.kind, p)
    settings += long_rows
    batch = _batch(cfg, max(mesh.data, 1), bool(learners), p)
    zero_from_recipe = any(s.key == "learner.zero_stage" and s.source.startswith("recipe") for s in settings)
    cfg, lora = resolve_lora(cfg, spec, ms, len(learners), batch.sequences_per_rank, layout is Layout.colocated,
                             zero_from_recipe, p)
    check_ignored(cfg, p)
    settings = _latest(settings + lora)
    memory = None
    if not p:  # sizes are sound: fit memory, filling micro-batch and engine share when left null
        cfg, fitted, memory = fit_with_overlap(cfg, spec, ms, len(learners), batch.sequences_per_rank,
                                               layout is Layout.colocated, derived_async, p)
        settings += fitted
        cfg, kv = size_kv_cache(cfg, spec, ms, batch, engines)
        settings += kv
    check_micro_batch(cfg, p)
    check_partial_rollouts(cfg, spec, p)
    check_lengths(cfg, spec, ms, bool(engines) and cfg.engine.tensor_parallel_size > 0, p)
    check_shaped_lengths(cfg, p)
    check_episodes(cfg, p)
    if p:
        raise PlanError(once_per_nonfinite(cfg, p))
    env, dropped = live_vllm_env(cfg.engine.env) if spec.passes_env else ({}, [])
    cfg, background = _checkpoint_background(cfg, device)
    settings.append(background)
    from rlgen.plan.launch_ahead import with_launch_ahead  # lazy: it reads the prediction's decode model

    return with_launch_ahead(Plan(
        config=cfg, engine=spec, learner_kind=learner.kind, layout=layout, device=device,
        hardware=cfg.hardware.name, nodes=cfg.hardware.nodes, gpus_per_node=cfg.hardware.gpus_per_node,
        engines=_shares(engines, cfg, spec), learners=learners, transport=transport_of(cfg, spec, layout),
        batch=batch, model=ms, async_steps=cfg.algo.async_steps, engine_env=env, mesh=mesh, teacher=teacher_plan(cfg),
        warnings=tuple(_idle_engine_gpus(cfg, engines, layout) + dropped + env_time_notes(cfg, len(engines))
                       + determinism),
        settings=tuple(settings), memory=memory,
        disk=disk_writes(cfg, ms.params, learner.kind, adapter_params(cfg)),
        room=hardware_room(cfg, spec, layout, engines, learners, ms),
    ))


def _with_engines_per_gpu(cfg: RunConfig, runnable: bool) -> Plan:
    """The plan with engine.engines_per_gpu chosen: the derived value (default_engines_per_gpu: two engines per
    GPU where they help), or 1 where the plan with two does not build. The choice, with what ruled out each
    candidate, goes on the plan (Plan.choices) and into the settings table."""
    spec = spec_of(cfg)
    params, _ = count_params(with_model_folder(cfg).model)
    k, why = default_engines_per_gpu(cfg, spec, layout_of(cfg, spec), params)
    tried: list[tuple[int, str]] = []
    for candidate in dict.fromkeys((k, 1)):
        try:
            plan = build_plan(set_key(cfg, "engine.engines_per_gpu", candidate), runnable=runnable)
        except PlanError as err:
            if candidate == 1:
                raise
            tried.append((candidate, err.problems[0] if err.problems else "does not build"))
            continue
        if tried:
            why = f"derived: {tried[0][0]} engines per GPU do not fit this GPU's memory beside the learner"
        choice = Choice("engine.engines_per_gpu", candidate, why, tuple(tried) + ((candidate, ""),))
        setting = Setting("engine.engines_per_gpu", candidate, why)
        return dataclasses.replace(plan, settings=plan.settings + (setting,), choices=plan.choices + (choice,))
    raise AssertionError("unreachable: the last candidate either builds or raises")


def _latest(settings: list[Setting]) -> list[Setting]:
    """One Setting per key, the last one given, in the order keys first appeared."""
    last = {s.key: s for s in settings}
    return [last[k] for k in dict.fromkeys(s.key for s in settings)]


def _checkpoint_background(cfg: RunConfig, device: str) -> tuple[RunConfig, Setting]:
    """checkpoint.background: the config's, or on for learners on GPUs (whose checkpoints take tens of seconds
    to write) and off on CPU."""
    if cfg.checkpoint.background is not None:
        return cfg, Setting("checkpoint.background", cfg.checkpoint.background, "config")
    on = device == "cuda"
    why = ("derived: learners on GPUs copy their state to host memory and train on while it is written" if on
           else "derived: CPU learners write their small checkpoints at once")
    return set_key(cfg, "checkpoint.background", on), Setting("checkpoint.background", on, why)


def _idle_engine_gpus(cfg: RunConfig, engines: tuple[EngineSlot, ...], layout: Layout) -> list[str]:
    hw = cfg.hardware
    used = sum(len(s.gpus) for s in engines)
    if layout is Layout.split and used < hw.engine_gpus:
        return [f"{hw.engine_gpus - used} of {hw.engine_gpus} engine GPUs stay idle with engine.num_engines={len(engines)}."]
    return []


__all__ = ["build_plan", "count_params", "layout_of", "model_summary", "spec_of", "transport_of"]
