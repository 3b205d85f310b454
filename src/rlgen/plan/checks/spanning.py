"""The plan's checks that span several settings: the hardware adds up, the learner can train the ranks it gets,
a sequence fits the engine and the model, an engine's share holds its weights, a micro-batch holds a row. Each
problem is one sentence that names the settings that cause it and says how to fix it. Pure: no torch."""

from __future__ import annotations

from rlgen.config import VLLM_ENV_REMOVED_IN_0_26, GPUSpec, RunConfig, TaskKind
from rlgen.config.cards import CARDS, CARDS_GROUP, card_advice, card_presets
from rlgen.config.compose import group_options, made_without_gpus
from rlgen.engines.registry import EngineSpec
from rlgen.learners.registry import LearnerSpec
from rlgen.plan.context import positions
from rlgen.plan.memory import ENGINE_HEADROOM_GIB, GIB, engine_floor_gib, longest_sequence, response_bound
from rlgen.plan.overlap import check_sleep_mode
from rlgen.plan.resolved import Layout, LearnerSlot, ModelSummary
from rlgen.rope import YARN_FACTORS


def hardware_problems(cfg: RunConfig) -> list[str]:
    """What makes the hardware itself impossible to plan for, one sentence per setting: no nodes, a negative GPU
    count, or no GPUs on hardware that names a GPU card (every other check would only restate it)."""
    hw, p = cfg.hardware, []
    if hw.nodes < 1:
        p.append(f"hardware.nodes={hw.nodes} must be at least 1.")
    if hw.gpus_per_node < 0:
        p.append(f"hardware.gpus_per_node={hw.gpus_per_node} must be >= 0 (0: no GPU, as hardware=cpu).")
    elif hw.gpus_per_node == 0 and hw.gpu.name != GPUSpec().name and made_without_gpus(hw.name):
        p.append(_card_without_gpus(hw.name, hw.gpu.name))
    elif hw.gpus_per_node == 0 and hw.gpu.name != GPUSpec().name:  # a card named: GPU hardware
        p.append(f"hardware.gpus_per_node=0 leaves hardware={hw.name} without its {hw.gpu.name} GPUs; set "
                 "hardware.gpus_per_node to the GPUs each node has, or use hardware=cpu for a machine without GPUs.")
    return p


def _card_without_gpus(preset: str, name: str) -> str:
    """A card given to a preset made without GPUs: drop it, or the presets made for that card."""
    found = next((c for c in CARDS if c.spec.name == name), None)
    presets = group_options("hardware")
    if found is None:
        gpu = next((p for c in CARDS for p in card_presets(c.key, presets)), None)
        return (f"hardware={preset} has no GPUs, so a GPU card ({name}) means nothing on it; drop the hardware.gpu "
                "settings" + (f", or choose a GPU preset such as hardware={gpu}." if gpu else "."))
    return (f"hardware={preset} has no GPUs, so a GPU card means nothing on it; drop the +{CARDS_GROUP}={found.key} "
            f"override, or {card_advice(found.key, presets)}.")


def check_hardware(cfg: RunConfig, spec: EngineSpec, layout: Layout, p: list[str]) -> None:
    hw = cfg.hardware
    if hw.gpus_per_node and hw.gpu.memory_gb <= 0:
        p.append(f"hardware {hw.name} has GPUs but hardware.gpu.memory_gb={hw.gpu.memory_gb}; give the GPU's memory in GB.")
    if layout is Layout.split:
        total = hw.nodes * hw.gpus_per_node
        if hw.engine_gpus + hw.learner_gpus != total:
            p.append(
                f"GPUs do not add up: hardware.engine_gpus={hw.engine_gpus} + hardware.learner_gpus={hw.learner_gpus} "
                f"= {hw.engine_gpus + hw.learner_gpus}, but hardware={hw.name} has {total} "
                f"({hw.nodes} node(s) x {hw.gpus_per_node}); make them add up to {total}, or set engine.colocate=true."
            )
    if (cfg.engine.colocate or hw.colocated) and hw.gpus_per_node == 0 and layout is not Layout.served:
        p.append(f"engine.colocate=true shares learner GPUs, but hardware={hw.name} has none; set engine.colocate=false.")
    check_sleep_mode(cfg, spec, layout is Layout.colocated, p)


def check_learners(cfg: RunConfig, learner: LearnerSpec, learners: tuple[LearnerSlot, ...], p: list[str]) -> None:
    """The learner the run builds can train the plan's ranks (nothing later refuses it)."""
    hw = cfg.hardware
    gpus = hw.gpus_per_node > 0
    if not gpus and "cpu" not in learner.devices:
        p.append(f"learner.kind={learner.kind.value} needs GPUs, but hardware={hw.name} has none; use learner.kind=auto "
                 "(the torch learner on CPU).")
        return
    ranks = len(learners)
    if ranks > 1 and ("cuda" if gpus else "cpu") not in learner.ranks:
        fix = "set hardware.learner_ranks=1" if not gpus else "use learner.kind=auto (DeepSpeed) or one learner GPU"
        where = " and ".join("GPUs" if d == "cuda" else "CPU" for d in learner.ranks) or "no device"
        p.append(f"the plan has {ranks} learner ranks, but {learner.label} trains with several only on {where}; "
                 f"{fix}.")


def check_lengths(cfg: RunConfig, spec: EngineSpec, ms: ModelSummary, has_engines: bool, p: list[str]) -> None:
    """A prompt plus its response fits the engine's max_model_len and the model's positions. The sentence names
    both parts and puts the larger first among the fixes."""
    e, t, m = cfg.engine, cfg.task, cfg.model
    name, resp = response_bound(cfg)
    need = t.max_prompt_tokens + resp
    parts = f"task.max_prompt_tokens={t.max_prompt_tokens} + {name}={resp} = {need}"
    shorter = (f"lower task.max_prompt_tokens (or shorten the prompts) or {name}" if t.max_prompt_tokens >= resp
               else f"lower {name} or task.max_prompt_tokens")
    if e.max_model_len < need:
        fix = (f"start the server with engine.max_model_len>={need}, or {shorter}" if spec.served
               else f"set engine.max_model_len>={need}")
        p.append(f"engine.max_model_len={e.max_model_len} cannot hold {parts}; {fix}.")
    room = positions(m)
    if room < need:
        key, other = ("task.max_prompt_tokens", resp) if t.max_prompt_tokens >= resp else (name, t.max_prompt_tokens)
        fits = room - other
        shorter += f" ({key}={fits} fits)" if fits > 0 else ""
        extended = f" with YaRN x{m.yarn_factor:g} ({room})" if room > m.max_position_embeddings else ""
        factor = next((f for f in YARN_FACTORS if need <= m.max_position_embeddings * f), None)
        yarn = ""
        if factor and m.path:
            yarn = f"YaRN x{factor:g} in the folder's config.json (its rope_scaling, as Qwen2.5 documents), "
        elif factor:
            yarn = f"model.yarn_factor={factor:g}, "
        p.append(f"{parts} tokens per sequence is more than model {m.name}'s max_position_embeddings="
                 f"{m.max_position_embeddings}{extended}; {shorter}, or use a model with more positions (model.path=, "
                 f"{yarn}or raise model.max_position_embeddings of a preset).")
    if has_engines:
        check_engine_floor(cfg, spec, ms, p)


def check_shaped_lengths(cfg: RunConfig, p: list[str]) -> None:
    """task.response_length_mean's random stop ids: for random weights only (a warm-started preset's trained
    answers would be cut), and below the response cap (at or above it, every response runs to the cap)."""
    mean, m, cap = cfg.task.response_length_mean, cfg.model, cfg.algo.max_new_tokens
    if mean <= 0:
        return
    if m.warm_start_steps > 0 and not m.path:
        p.append(f"task.response_length_mean={mean} adds random stop ids, meant for random weights, but model "
                 f"{m.name} is warm-started (model.warm_start_steps={m.warm_start_steps}), so they would cut its "
                 "trained answers short; set model.warm_start_steps=0 for random weights, or drop "
                 "task.response_length_mean.")
    if mean >= cap:
        p.append(f"task.response_length_mean={mean} is not below the response cap algo.max_new_tokens={cap}, so "
                 f"every response would run to the cap; set task.response_length_mean below {cap}, or raise "
                 "algo.max_new_tokens.")


def shaped_length_notes(cfg: RunConfig) -> list[str]:
    """A warning for task.response_length_mean on model.path, a folder that may hold trained weights."""
    mean = cfg.task.response_length_mean
    if mean <= 0 or not cfg.model.path:
        return []
    return [f"task.response_length_mean={mean} adds random stop ids that cut a trained model's answers short, and "
            f"is meant for random-weight models; drop it unless model.path={cfg.model.path} holds random weights."]


def check_engine_floor(cfg: RunConfig, spec: EngineSpec, ms: ModelSummary, p: list[str]) -> None:
    """An engine's share of its GPU holds its weights and one max_model_len sequence's KV cache (engines sharing a
    GPU split gpu_memory_utilization evenly)."""
    e, hw = cfg.engine, cfg.hardware
    if e.kv_cache_gib and not (hw.gpus_per_node and spec.memory_share):
        where = f"engine={spec.kind}" if not spec.memory_share else f"hardware={hw.name} (no GPU)"
        p.append(f"engine.kv_cache_gib={e.kv_cache_gib} has no effect with {where}: only vLLM engines on GPUs take "
                 "a KV-cache size; drop it.")
    if hw.gpus_per_node and spec.memory_share and e.gpu_memory_utilization:
        k = e.engines_per_gpu
        usable = hw.gpu.memory_gb * 1e9 / GIB * e.gpu_memory_utilization / k
        weights, kv_one = engine_floor_gib(cfg, ms.weight_gib_bf16, ms.kv_bytes_per_token)
        if weights + kv_one + ENGINE_HEADROOM_GIB > usable:
            split = f" / {k} engines per GPU" if k > 1 else ""
            fixes = "lower engine.engines_per_gpu, raise" if k > 1 else "raise engine.tensor_parallel_size or"
            p.append(
                f"model {cfg.model.name} ({ms.params / 1e9:.2f}B params, {weights:.1f} GiB of bf16 weights per GPU) "
                f"plus the KV cache of one {e.max_model_len}-token sequence ({kv_one:.1f} GiB) does not fit in "
                f"{usable:.1f} GiB ({hw.gpu.memory_gb:g} GB x gpu_memory_utilization {e.gpu_memory_utilization}"
                f"{split}); {fixes} engine.gpu_memory_utilization, or use a smaller model."
            )
        elif e.kv_cache_gib and e.kv_cache_gib < kv_one:
            p.append(f"engine.kv_cache_gib={e.kv_cache_gib} holds less than one {e.max_model_len}-token sequence "
                     f"({kv_one:.2f} GiB); raise it to {kv_one:.2f} or more, or leave it null.")
        elif e.kv_cache_gib and weights + e.kv_cache_gib + ENGINE_HEADROOM_GIB > usable:
            p.append(f"engine.kv_cache_gib={e.kv_cache_gib} and the engine's {weights:.1f} GiB of weights do not fit "
                     f"its {usable:.1f} GiB share of the GPU; lower it to {usable - weights - ENGINE_HEADROOM_GIB:.1f}"
                     " or less, or leave it null.")


def check_micro_batch(cfg: RunConfig, p: list[str]) -> None:
    """A micro-batch budget the config sets holds the longest row (a prompt and its response at their bounds):
    a row is never split over micro-batches."""
    tokens, longest = cfg.algo.micro_batch_tokens, longest_sequence(cfg)
    if tokens and 0 < tokens < longest:
        name, bound = response_bound(cfg)
        p.append(f"algo.micro_batch_tokens={tokens} cannot hold the longest row, task.max_prompt_tokens="
                 f"{cfg.task.max_prompt_tokens} + {name}={bound} = {longest} tokens (a row is never split over "
                 f"micro-batches); raise it to {longest} or more, or leave it unset for the most that fits.")


def live_vllm_env(env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """engine.env without the variables vLLM 0.26 no longer reads, and a note for each one dropped."""
    kept = {k: str(v) for k, v in env.items() if k not in VLLM_ENV_REMOVED_IN_0_26}
    notes = [
        f"engine.env.{name} is not passed on: vLLM 0.26 removed it ({why})."
        for name, why in VLLM_ENV_REMOVED_IN_0_26.items()
        if name in env
    ]
    return kept, notes


def check_partial_rollouts(cfg: RunConfig, spec: EngineSpec, p: list[str]) -> None:
    """algo.partial_rollouts: a share in [0, 4], engines that cut a call short, and single-turn rollouts whose
    groups are trained as they come (not refilled)."""
    a = cfg.algo
    if a.partial_max_steps < 1:
        p.append(f"algo.partial_max_steps={a.partial_max_steps} must be >= 1 (the steps a group may be carried before "
                 "it runs to its end; 1 or 2 is usual).")
    if not a.partial_rollouts:
        return
    if not 0 < a.partial_rollouts <= 4:
        p.append(f"algo.partial_rollouts={a.partial_rollouts} must be in (0, 4]: the share of groups a step's "
                 "generation holds beyond those it trains (0.25 is usual; 0 turns partial rollouts off).")
        return
    most = max(1, cfg.steps - 1)  # a group first cut at step 0 is carried into steps 1 .. steps-1 at most
    if a.partial_max_steps > most:
        p.append(f"algo.partial_max_steps={a.partial_max_steps} is more than a run of steps={cfg.steps} can carry a "
                 f"group (one first cut at step 0 is carried at most {most} times), so a group cut short may never be "
                 f"made to finish; set algo.partial_max_steps={min(2, most)} (at most {most}) or raise steps.")
    if not spec.cuts_short:
        p.append(f"algo.partial_rollouts needs engines that end a call once enough groups are done, which "
                 f"engine={spec.kind} does not; use engine=vllm or engine=hf, or set algo.partial_rollouts=0.")
    if a.dynamic_sampling:
        p.append("algo.partial_rollouts and algo.dynamic_sampling both decide which groups a step trains; turn one "
                 "off (algo.dynamic_sampling=false or algo.partial_rollouts=0).")
    if cfg.task.kind == TaskKind.env:
        p.append("algo.partial_rollouts carries single-turn responses into the next step, not multi-turn episodes; "
                 "set algo.partial_rollouts=0 for task.kind=env.")


__all__ = ["check_engine_floor", "check_hardware", "check_learners", "check_lengths", "check_micro_batch",
           "check_partial_rollouts", "check_shaped_lengths", "hardware_problems", "live_vllm_env",
           "shaped_length_notes"]
