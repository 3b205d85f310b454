"""RunConfig -> Plan: where every engine and learner runs, the batch geometry, the weight transport.

A pure function of the config: no torch, no Ray, no GPU. Every check that spans several fields runs here,
before anything launches, and each failure says how to fix it. All problems are reported at once.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from rlgen.charvocab import CHAR_VOCAB_SIZE
from rlgen.config import (
    VLLM_ENV_REMOVED_IN_0_26,
    EngineKind,
    RunConfig,
    Setting,
    Transport,
    WeightsOver,
    set_key,
)
from rlgen.errors import UserError
from rlgen.plan.memory import (
    ENGINE_HEADROOM_GIB,
    GIB,
    LOGITS_SHARE,
    MemorySplit,
    engine_floor_gib,
    logits_budget_bytes,
    logits_bytes,
)
from rlgen.plan.model_folder import with_model_folder
from rlgen.plan.overlap import check_sleep_mode, default_async_steps, fit_with_overlap
from rlgen.plan.recipes import fill_recipe
from rlgen.plan.remote import with_server
from rlgen.plan.values import check_values


class PlanError(UserError, ValueError):
    """The config cannot run. ``problems`` holds one sentence per problem, each with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class EngineSlot:
    index: int
    node: int
    gpus: tuple[int, ...]  # GPU indices on that node; () on CPU
    tensor_parallel_size: int


@dataclass(frozen=True)
class LearnerSlot:
    rank: int
    node: int
    gpu: int | None  # None on CPU


@dataclass(frozen=True)
class BatchGeometry:
    prompts_per_step: int
    samples_per_prompt: int
    sequences_per_step: int
    learner_ranks: int
    sequences_per_rank: int
    max_prompt_tokens: int
    max_new_tokens: int
    max_seq_len: int  # prompt + response


@dataclass(frozen=True)
class ModelSummary:
    name: str
    params: int
    vocab_size: int
    weight_gib_bf16: float
    kv_bytes_per_token: int  # bf16, all layers, before tensor parallelism


@dataclass(frozen=True)
class Plan:
    engine_kind: str
    device: str  # "cpu" | "cuda"
    hardware: str
    nodes: int
    gpus_per_node: int
    engines: tuple[EngineSlot, ...]
    learners: tuple[LearnerSlot, ...]
    colocated: bool
    transport: Transport
    batch: BatchGeometry
    model: ModelSummary
    async_steps: int
    engine_env: dict[str, str]  # passed to vLLM engine actors
    warnings: tuple[str, ...]
    settings: tuple[Setting, ...] = ()  # the values the config left null (auto), filled, and every one's source
    memory: MemorySplit | None = None  # per GPU: the engine's share, the learner's idle and peak footprint

    @property
    def engines_awake(self) -> bool:
        """Colocated vLLM engines that stay awake while the learner trains (async_steps > 0): they generate the
        next batch meanwhile and take weight updates in flight. Otherwise colocated engines sleep meanwhile."""
        return self.colocated and self.engine_kind == "vllm" and self.async_steps > 0

    def apply(self, cfg: RunConfig) -> RunConfig:
        """cfg with the plan's resolved settings: what actors, learners and engines run with."""
        for s in self.settings:
            cfg = set_key(cfg, s.key, s.value)
        return cfg

    def to_dict(self) -> dict:
        d = asdict(self)
        d["transport"] = self.transport.value
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def count_params(m) -> tuple[int, int]:
    """(parameters, vocab size) of a Qwen2-architecture preset, counted from its shape."""
    vocab = m.vocab_size or CHAR_VOCAB_SIZE
    h, inter, layers = m.hidden_size, m.intermediate_size, m.num_layers
    head_dim = h // max(m.num_heads, 1)
    kv = m.num_kv_heads * head_dim
    attn = (h * h + h) + 2 * (h * kv + kv) + h * h  # q (bias), k and v (bias), o
    mlp = 3 * h * inter
    per_layer = attn + mlp + 2 * h  # two RMSNorms
    params = vocab * h + layers * per_layer + h + (0 if m.tie_word_embeddings else vocab * h)
    return params, vocab


def _model_summary(cfg: RunConfig) -> ModelSummary:
    m = cfg.model
    params, vocab = count_params(m)
    head_dim = m.hidden_size // max(m.num_heads, 1)
    kv_per_token = 2 * m.num_layers * m.num_kv_heads * head_dim * 2
    return ModelSummary(m.name, params, vocab, params * 2 / GIB, kv_per_token)


def shared_gpu_problem(cfg: RunConfig, colocated: bool) -> str | None:
    """Why engine.engines_per_gpu > 1 cannot run here, with the fix (None: it can, or it is 1)."""
    e, hw, k = cfg.engine, cfg.hardware, cfg.engine.engines_per_gpu
    if k == 1:
        return None
    if e.kind != EngineKind.vllm or hw.gpus_per_node == 0:
        return (f"engine.engines_per_gpu={k} shares a GPU between vLLM engines, and engine={e.kind.value} on "
                f"hardware={hw.name} runs one engine per device; set engine.engines_per_gpu=1.")
    if e.tensor_parallel_size != 1:
        return (f"engine.engines_per_gpu={k} shares one GPU between engines, but engine.tensor_parallel_size="
                f"{e.tensor_parallel_size} spreads each engine over whole GPUs; set one of them to 1.")
    if not colocated:
        return (f"engine.engines_per_gpu={k} needs engines colocated with the learner (hardware.colocated=true), "
                "where weights reach every engine on the GPU through CUDA IPC. Engines on their own GPUs take "
                "weights over NCCL, which cannot hold two engines of one GPU in one update; set "
                "hardware.colocated=true, or engine.engines_per_gpu=1.")
    return None


def _place_engines(cfg: RunConfig, colocated: bool, p: list[str]) -> tuple[EngineSlot, ...]:
    e, hw = cfg.engine, cfg.hardware
    tp = e.tensor_parallel_size
    shared = shared_gpu_problem(cfg, colocated)
    if shared:
        p.append(shared)
        return ()
    if e.kind == EngineKind.remote:
        # The server's engines, each spoken for by a small CPU actor beside the learners (rank 0's node).
        node = hw.nodes - 1 if hw.gpus_per_node == 0 else 0
        return tuple(EngineSlot(i, node, (), tp) for i in range(e.num_engines or 1))
    if hw.gpus_per_node == 0:
        if e.kind == EngineKind.vllm:
            p.append(
                f"engine={e.kind.value} needs CUDA GPUs, but hardware={hw.name} has none; "
                "use engine=hf on CPU, or choose GPU hardware such as hardware=1xh100."
            )
            return ()
        if tp != 1:
            p.append(f"engine.tensor_parallel_size={tp} needs GPUs; on hardware={hw.name} set it to 1.")
            return ()
        n = e.num_engines or 1
        # Several CPU nodes: engines on all but the last node, round-robin; the learner takes the last one.
        engine_nodes = max(1, hw.nodes - 1)
        return tuple(EngineSlot(i, i % engine_nodes, (), 1) for i in range(n))

    if e.kind == EngineKind.hf and tp != 1:
        p.append(f"engine=hf does not shard across GPUs; set engine.tensor_parallel_size=1 or use engine=vllm_tp{tp}.")
        return ()
    total = hw.nodes * hw.gpus_per_node
    engine_gpus = total if colocated else hw.engine_gpus
    if engine_gpus < 1:
        p.append(f"hardware.engine_gpus={engine_gpus}: engines need at least one GPU; set hardware.engine_gpus.")
        return ()
    if tp > hw.gpus_per_node:
        p.append(
            f"engine.tensor_parallel_size={tp} is larger than a node ({hw.gpus_per_node} GPUs) and a TP group never "
            f"spans nodes; use tensor_parallel_size <= {hw.gpus_per_node}."
        )
        return ()
    if engine_gpus % tp:
        p.append(
            f"engine.tensor_parallel_size={tp} does not divide the {engine_gpus} engine GPUs of hardware={hw.name}; "
            f"choose a TP size that divides {engine_gpus}, or change hardware.engine_gpus."
        )
        return ()
    if cfg.model.num_heads % tp:
        p.append(
            f"model {cfg.model.name} has {cfg.model.num_heads} attention heads, which do not split over "
            f"tensor_parallel_size={tp}; pick a TP size that divides {cfg.model.num_heads}."
        )
        return ()
    # Engines fill nodes from node 0; each node's engine share must hold whole TP groups.
    slots: list[EngineSlot] = []
    remaining = engine_gpus
    for node in range(hw.nodes):
        here = min(remaining, hw.gpus_per_node)
        if here % tp:
            p.append(
                f"node {node} would hold {here} engine GPUs, which is not a whole number of TP-{tp} groups, and a TP "
                "group never spans nodes; make hardware.engine_gpus a multiple of "
                f"{tp} on every node (e.g. {tp * (hw.gpus_per_node // tp)})."
            )
            return ()
        for g in range(0, here, tp):
            for _ in range(e.engines_per_gpu):  # engines sharing a GPU sit next to each other
                slots.append(EngineSlot(len(slots), node, tuple(range(g, g + tp)), tp))
        remaining -= here
        if remaining == 0:
            break
    want = e.num_engines
    if want is not None:
        if want > len(slots) and e.engines_per_gpu > 1:
            p.append(
                f"engine.num_engines={want} is more than the {len(slots)} engines that {engine_gpus} GPU(s) hold at "
                f"engine.engines_per_gpu={e.engines_per_gpu} on hardware={hw.name}; set engine.num_engines<="
                f"{len(slots)}, or raise engine.engines_per_gpu."
            )
            return ()
        if want > len(slots):
            p.append(
                f"engine.num_engines={want} with tensor_parallel_size={tp} needs {want * tp} GPUs, but only "
                f"{engine_gpus} are for engines on hardware={hw.name}; set engine.num_engines<={len(slots)} "
                "or raise hardware.engine_gpus."
            )
            return ()
        slots = slots[:want]
    return tuple(slots)


def _place_learners(cfg: RunConfig, colocated: bool, p: list[str]) -> tuple[LearnerSlot, ...]:
    hw = cfg.hardware
    if hw.gpus_per_node == 0:
        if hw.learner_ranks < 1:
            p.append(f"hardware.learner_ranks={hw.learner_ranks} must be at least 1.")
            return ()
        return tuple(LearnerSlot(r, hw.nodes - 1, None) for r in range(hw.learner_ranks))
    total = hw.nodes * hw.gpus_per_node
    if colocated or cfg.engine.kind == EngineKind.remote:  # remote engines leave every GPU to the learners
        return tuple(LearnerSlot(r, r // hw.gpus_per_node, r % hw.gpus_per_node) for r in range(total))
    if hw.learner_gpus < 1:
        p.append(f"hardware.learner_gpus={hw.learner_gpus}: learners need at least one GPU; set hardware.learner_gpus.")
        return ()
    start = hw.engine_gpus
    return tuple(
        LearnerSlot(r, (start + r) // hw.gpus_per_node, (start + r) % hw.gpus_per_node) for r in range(hw.learner_gpus)
    )


def _check_hardware(cfg: RunConfig, colocated: bool, p: list[str]) -> None:
    hw = cfg.hardware
    if hw.nodes < 1 or hw.gpus_per_node < 0:
        p.append(f"hardware {hw.name}: nodes={hw.nodes} must be >= 1 and gpus_per_node={hw.gpus_per_node} >= 0.")
        return
    if hw.gpus_per_node and hw.gpu.memory_gb <= 0:
        p.append(f"hardware {hw.name} has GPUs but hardware.gpu.memory_gb={hw.gpu.memory_gb}; give the GPU's memory in GB.")
    if hw.gpus_per_node and not colocated and cfg.engine.kind != EngineKind.remote:
        total = hw.nodes * hw.gpus_per_node
        if hw.engine_gpus + hw.learner_gpus != total:
            p.append(
                f"GPUs do not add up: hardware.engine_gpus={hw.engine_gpus} + hardware.learner_gpus={hw.learner_gpus} "
                f"= {hw.engine_gpus + hw.learner_gpus}, but hardware={hw.name} has {total} "
                f"({hw.nodes} node(s) x {hw.gpus_per_node}); make them add up to {total}, or set engine.colocate=true."
            )
    if colocated and hw.gpus_per_node == 0:
        p.append(f"engine.colocate=true shares learner GPUs, but hardware={hw.name} has none; set engine.colocate=false.")
    check_sleep_mode(cfg, colocated, p)


def _check_learners(cfg: RunConfig, learners: tuple[LearnerSlot, ...], colocated: bool, p: list[str]) -> None:
    """The learner the run would build can train the plan's ranks (the orchestrator refuses nothing later)."""
    hw, kind = cfg.hardware, cfg.learner.kind.value
    gpus = hw.gpus_per_node > 0
    if kind == "deepspeed" and not gpus:
        p.append(f"learner.kind=deepspeed needs GPUs, but hardware={hw.name} has none; use learner.kind=auto "
                 "(the torch learner on CPU).")
        return
    deepspeed = kind == "deepspeed" or (kind == "auto" and gpus)
    ranks = len(learners)
    if ranks > 1 and not deepspeed:
        fix = "set hardware.learner_ranks=1" if not gpus else "use learner.kind=auto (DeepSpeed) or one learner GPU"
        p.append(f"the plan has {ranks} learner ranks, but only the DeepSpeed learner (on GPUs) trains with several; "
                 f"{fix}.")
    if ranks > 1 and colocated:
        p.append(
            f"colocated engines with {ranks} learner ranks are not supported (the IPC weight path sends from one "
            "rank); give engines their own GPUs (hardware.colocated=false) or use one GPU."
        )


def _check_lengths(cfg: RunConfig, ms: ModelSummary, n_engine_gpus_each: int, p: list[str]) -> None:
    e, a, t, m = cfg.engine, cfg.algo, cfg.task, cfg.model
    need = t.max_prompt_tokens + a.max_new_tokens
    if e.max_model_len < need:
        fix = (f"start the server with engine.max_model_len>={need}, or lower algo.max_new_tokens"
               if e.kind == EngineKind.remote else f"set engine.max_model_len>={need}")
        p.append(
            f"engine.max_model_len={e.max_model_len} cannot hold task.max_prompt_tokens={t.max_prompt_tokens} + "
            f"algo.max_new_tokens={a.max_new_tokens} = {need}; {fix}."
        )
    if m.max_position_embeddings < need:
        p.append(
            f"model {m.name} has max_position_embeddings={m.max_position_embeddings} < {need} tokens per sequence; "
            f"lower algo.max_new_tokens or raise model.max_position_embeddings."
        )
    if n_engine_gpus_each:
        check_engine_floor(cfg, ms, p)


def check_engine_floor(cfg: RunConfig, ms: ModelSummary, p: list[str]) -> None:
    """A vLLM engine's share of its GPU holds its weights and one max_model_len sequence's KV cache (engines
    sharing a GPU split gpu_memory_utilization evenly)."""
    e, hw = cfg.engine, cfg.hardware
    if hw.gpus_per_node and e.kind == EngineKind.vllm and e.gpu_memory_utilization:
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


def _check_logits(cfg: RunConfig, ms: ModelSummary, per_rank: int, p: list[str]) -> None:
    """A learner micro-batch's fp32 logits over the whole vocabulary must fit its GPU: with large vocabularies
    (Qwen2.5: 151,936) one pass over every row needs far more memory than the GPU has."""
    a, hw = cfg.algo, cfg.hardware
    seq = cfg.task.max_prompt_tokens + a.max_new_tokens
    per_row = logits_bytes(seq, ms.vocab_size)
    budget = logits_budget_bytes(hw)
    rows = a.micro_batch_size if a.micro_batch_size > 0 else per_rank
    if rows * per_row > budget:
        fits = max(1, int(budget // per_row))
        pick = max((d for d in range(1, min(fits, per_rank) + 1) if per_rank % d == 0), default=1)
        p.append(
            f"a learner micro-batch of {rows} sequences x {seq} tokens x {ms.vocab_size:,} vocabulary needs about "
            f"{rows * per_row / GIB:.0f} GiB for its logits alone, more than {LOGITS_SHARE:.0%} of a "
            f"{hw.gpu.memory_gb:g} GB GPU; set algo.micro_batch_size={pick} (or lower)."
        )


def live_vllm_env(env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """engine.env without the variables vLLM 0.26 no longer reads, and a note for each one dropped."""
    kept = {k: str(v) for k, v in env.items() if k not in VLLM_ENV_REMOVED_IN_0_26}
    notes = [
        f"engine.env.{name} is not passed on: vLLM 0.26 removed it ({why})."
        for name, why in VLLM_ENV_REMOVED_IN_0_26.items()
        if name in env
    ]
    return kept, notes


def build_plan(cfg: RunConfig, *, runnable: bool = True) -> Plan:
    """Resolve and check a RunConfig. Raises PlanError listing every problem with its fix.

    runnable=False checks the geometry only (placement, batch, lengths), not whether today's learners can run
    it: the placement tests use it for layouts the learners do not support yet (colocated learner groups)."""
    cfg = with_model_folder(cfg)
    params, vocab = count_params(cfg.model)
    cfg, settings = fill_recipe(cfg, params)
    p: list[str] = []
    cfg, served = with_server(cfg, params, vocab, p)
    if p:
        raise PlanError(p)
    settings += served
    if cfg.engine.max_model_len is None:
        need = cfg.task.max_prompt_tokens + cfg.algo.max_new_tokens
        cfg = set_key(cfg, "engine.max_model_len", need)
        settings.append(Setting("engine.max_model_len", need, "derived: task.max_prompt_tokens + algo.max_new_tokens"))
    warnings: list[str] = []
    check_values(cfg, p)
    # remote engines share nothing with the learners, whatever the hardware preset says about its own engines
    colocated = bool(cfg.engine.colocate or cfg.hardware.colocated) and cfg.engine.kind != EngineKind.remote
    derived_async = default_async_steps(cfg, colocated) if cfg.algo.async_steps is None else None
    if derived_async:
        cfg = set_key(cfg, "algo.async_steps", derived_async.value)
    _check_hardware(cfg, colocated, p)
    engines = _place_engines(cfg, colocated, p)
    learners = _place_learners(cfg, colocated, p)
    if runnable:
        _check_learners(cfg, learners, colocated, p)
    ms = _model_summary(cfg)
    ranks = max(len(learners), 1)
    a = cfg.algo
    seqs = a.prompts_per_step * a.samples_per_prompt
    if learners and seqs % ranks:
        p.append(
            f"the batch of {seqs} sequences (algo.prompts_per_step={a.prompts_per_step} x "
            f"algo.samples_per_prompt={a.samples_per_prompt}) does not split over {ranks} learner ranks; "
            f"make algo.prompts_per_step a multiple of {ranks}."
        )
    per_rank = seqs // ranks if learners and not seqs % ranks else 0
    memory = None
    if not p:  # sizes are sound: fit memory, filling micro-batch and engine share when left null
        cfg, fitted, memory = fit_with_overlap(cfg, ms, len(learners), per_rank, colocated, derived_async, p)
        settings += fitted
    a = cfg.algo
    _check_lengths(cfg, ms, cfg.engine.tensor_parallel_size if engines else 0, p)
    if a.micro_batch_size and per_rank and per_rank % a.micro_batch_size:
        p.append(
            f"algo.micro_batch_size={a.micro_batch_size} does not divide the {per_rank} sequences each learner "
            "rank trains on; pick a divisor of that, or 0 for one pass."
        )
    if learners and cfg.hardware.gpus_per_node and per_rank and a.micro_batch_size is not None:
        _check_logits(cfg, ms, per_rank, p)
    if p:
        raise PlanError(p)

    hw = cfg.hardware
    if hw.gpus_per_node and not colocated:
        used = sum(len(s.gpus) for s in engines)
        if used < hw.engine_gpus:
            warnings.append(f"{hw.engine_gpus - used} of {hw.engine_gpus} engine GPUs stay idle with engine.num_engines={len(engines)}.")
    env, dropped = live_vllm_env(cfg.engine.env)
    warnings.extend(dropped)
    if cfg.engine.kind != EngineKind.vllm:
        env = {}

    if cfg.engine.kind == EngineKind.remote:
        transport = Transport.nccl if cfg.engine.weights_over == WeightsOver.nccl else Transport.http
    elif hw.gpus_per_node == 0 or cfg.engine.kind == EngineKind.hf:
        transport = Transport.ray_object_store
    elif colocated:
        transport = Transport.cuda_ipc
    else:
        transport = Transport.nccl

    return Plan(
        engine_kind=cfg.engine.kind.value,
        device="cuda" if hw.gpus_per_node else "cpu",
        hardware=hw.name,
        nodes=hw.nodes,
        gpus_per_node=hw.gpus_per_node,
        engines=engines,
        learners=learners,
        colocated=colocated,
        transport=transport,
        batch=BatchGeometry(
            prompts_per_step=a.prompts_per_step,
            samples_per_prompt=a.samples_per_prompt,
            sequences_per_step=seqs,
            learner_ranks=ranks,
            sequences_per_rank=per_rank,
            max_prompt_tokens=cfg.task.max_prompt_tokens,
            max_new_tokens=a.max_new_tokens,
            max_seq_len=cfg.task.max_prompt_tokens + a.max_new_tokens,
        ),
        model=ms,
        async_steps=a.async_steps,
        engine_env=env,
        warnings=tuple(warnings),
        settings=tuple(settings),
        memory=memory,
    )
