"""GPU memory: what a learner rank holds, how much of a shared GPU the engine may take, and the largest
learner micro-batch that fits. Pure arithmetic on the model's shape: no torch.

A learner rank holds its weights, the frozen reference and teacher, fp32 master weights and AdamW moments under its
ZeRO stage, gradients, one micro-batch's activations (linear in its packed tokens) and the allocator's slack beside
them, one chunk of the LM head's fp32 logits, a fixed allowance and, colocated, the IPC buffer; with LoRA only the
adapters train. The micro-batch's token budget (algo.micro_batch_tokens) is decided here, once: the most that fit. Colocated, the engines take what the
idle learner leaves (``algo.async_steps=0``) or what its peak leaves of AWAKE_SHARE (``async_steps>0``), split
evenly between ``engine.engines_per_gpu`` engines. docs/plan.md gives every term.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from rlgen.config import (
    LORA_BLOCK_LINEARS,
    LORA_DEFAULT_RANK,
    DistillEstimator,
    EngineConfig,
    RunConfig,
    Setting,
    TaskKind,
    set_key,
)
from rlgen.engines.registry import EngineSpec
from rlgen.engines.vllm.args import VLLM_DEFAULT_SHARE
from rlgen.microbatches import TILE_TOKENS, chunk_tokens
from rlgen.plan.recipes import recipe_for
from rlgen.plan.teacher import frozen_bytes, teacher_plan
from rlgen.plan.tensor_parallel import kv_groups

GIB = 2**30
ENGINE_HEADROOM_GIB = 1.0  # activations, CUDA graphs and the sampler, beyond weights and KV
ENGINE_ASLEEP_GIB = 2.0  # what a sleeping vLLM engine keeps: CUDA graphs, its context
ENGINE_PROCESS_GIB = 2.5  # a further engine process on a GPU, outside its share (2.4 GiB measured on an H100)
AWAKE_SHARE = 0.85  # colocated: engine awake + idle learner stay under this share of the GPU
TRAIN_SHARE = 0.92  # the learner's peak (+ a sleeping engine) stays under this share of the GPU
# fitted to the device's count (docs/plan.md): CUDA context, NCCL, DeepSpeed's buckets; the allocator's cache per
LEARNER_OVERHEAD_GIB, ALLOCATOR_SLACK = 2.9, 0.6  # GiB of activations (freed blocks it keeps beside them)
LOGITS_COPIES = 4  # a chunk's fp32 logits, its softmax, and in backward the recomputed logits and their gradient
# algo.distill_estimator=full: beside those, the teacher's logits and log-softmax and the student's log-softmax and
# its exponent (counted, not yet measured on a GPU)
TAUGHT_LOGITS_COPIES = 8
TOKEN_STEP = 1024  # a derived micro-batch budget is a multiple of this many tokens


def block_linears(m) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of a block of the model's shape (ModelConfig m)."""
    h, head = m.hidden_size, m.hidden_size // max(m.num_heads, 1)
    q, kv, inter = m.num_heads * head, m.num_kv_heads * head, m.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, inter),
            "up_proj": (h, inter), "down_proj": (inter, h)}


def adapter_params(cfg: RunConfig) -> int:
    """LoRA's trainable parameters: rank x (in + out features) per target linear layer per block; 0 without LoRA."""
    lora, m = cfg.learner.lora, cfg.model
    if not lora.enabled:
        return 0
    dims = block_linears(m)
    targets = lora.target_modules or LORA_BLOCK_LINEARS
    return int(lora.rank or LORA_DEFAULT_RANK) * m.num_layers * sum(sum(dims.get(t, (0, 0))) for t in targets)


def logits_bytes(tokens: int, vocab: int, taught: bool = False) -> float:
    """The fp32 logits the LM head makes at once for a micro-batch of `tokens` tokens (one chunk of its response
    tokens, rlgen.microbatches.chunk_tokens), LOGITS_COPIES times (TAUGHT_LOGITS_COPIES beside a teacher's head:
    taught)."""
    return min(tokens, chunk_tokens(vocab)) * vocab * 4 * (TAUGHT_LOGITS_COPIES if taught else LOGITS_COPIES)


def taught_bytes(cfg: RunConfig, tokens: int) -> tuple[bool, float]:
    """(whether the teacher's head runs beside the policy's, algo.distill_estimator=full; the teacher's last hidden
    states of a micro-batch of `tokens` tokens in half precision, bytes, that it then holds)."""
    if not cfg.algo.teacher or DistillEstimator(cfg.algo.distill_estimator) is not DistillEstimator.full:
        return False, 0.0
    teacher = teacher_plan(cfg)
    return True, 2.0 * tokens * (teacher.model.hidden_size if teacher else cfg.model.hidden_size)


def engine_floor_gib(cfg: RunConfig, weight_gib: float, kv_bytes_per_token: int) -> tuple[float, float]:
    """Per engine GPU: its share of the bf16 weights and of one max-length sequence's KV cache (a KV head copied
    onto several GPUs, when TP exceeds the KV heads, is whole on each). An engine needs both plus
    ENGINE_HEADROOM_GIB."""
    tp = cfg.engine.tensor_parallel_size
    kv_parts = kv_groups(cfg.model.num_kv_heads, tp)
    return weight_gib / tp, kv_bytes_per_token * cfg.engine.max_model_len / kv_parts / GIB


@dataclass(frozen=True)
class LearnerMemory:
    weights: float  # GiB per rank
    optimizer: float
    reference: float
    overhead: float
    gradients: float
    activations: float
    logits: float
    ipc_buffer: float = 0.0  # colocated vLLM: the resident buffer the weights travel through to the engines
    adapters: int = 0  # LoRA's trainable parameters (0: full fine-tuning)

    @property
    def idle(self) -> float:
        return self.weights + self.optimizer + self.reference + self.overhead + self.ipc_buffer

    @property
    def peak(self) -> float:  # the device's count: the allocator's slack beside the activations
        return self.idle + self.gradients + self.activations * (1 + ALLOCATOR_SLACK) + self.logits

    def parts(self) -> str:
        lora = f" of a frozen base and {self.adapters / 1e6:.1f}M LoRA parameters" if self.adapters else ""
        ipc = f", IPC buffer {self.ipc_buffer:.1f}" if self.ipc_buffer else ""
        return (f"weights {self.weights + self.reference:.1f}{lora}, optimizer {self.optimizer:.1f}, gradients "
                f"{self.gradients:.1f}, activations {self.activations:.1f} and the allocator's slack "
                f"{self.activations * ALLOCATOR_SLACK:.1f}, logits {self.logits:.1f}, overhead {self.overhead:.1f}{ipc} GiB")


@dataclass(frozen=True)
class MemorySplit:
    """Per GPU, GiB. engine_fraction is vLLM's gpu_memory_utilization (None: no vLLM engine)."""

    gpu_gib: float
    engine_fraction: float | None
    learner_idle_gib: float
    learner_peak_gib: float
    micro_batch_tokens: int  # a learner micro-batch's budget of packed tokens (0: a rank's rows in one)
    colocated: bool
    engine_awake: bool = False  # colocated, and the engine stays awake while the learner trains
    engines_per_gpu: int = 1  # engines splitting engine_fraction between them
    learner_parts: str = ""  # the learner's peak by part (LearnerMemory.parts)


def response_bound(cfg: RunConfig) -> tuple[str, int]:
    """The setting that bounds a response's tokens, and its value: a multi-turn episode's are its whole
    (the policy's turns and the environment's answers); a single turn's, the smaller of its turn and its whole
    (the environment adds nothing after the one turn)."""
    t, new = cfg.task, cfg.algo.max_new_tokens
    if t.kind == TaskKind.env and not (t.max_turns == 1 and new and new < t.max_total_tokens):
        return "task.max_total_tokens", t.max_total_tokens
    return "algo.max_new_tokens", new


def longest_sequence(cfg: RunConfig) -> int:
    """The tokens of the longest row a learner trains on: the prompt bound plus the response bound."""
    return cfg.task.max_prompt_tokens + (response_bound(cfg)[1] or 0)


def learner_memory(cfg: RunConfig, params: int, vocab: int, ranks: int, tokens: int,
                   ipc_gib: float = 0.0) -> LearnerMemory:
    """A rank's memory training micro-batches of `tokens` packed tokens; under sequence parallelism
    (learner.sequence_parallel) each rank holds its slice of them, the activations and logits that slice's."""
    m, lc = cfg.model, cfg.learner
    n = max(ranks, 1)
    tokens = -(-tokens // max(lc.sequence_parallel or 1, 1))
    z3 = lc.zero_stage == 3
    mlp_tokens = min(tokens, TILE_TOKENS) if lc.tiled_mlp else tokens  # a tiled MLP's widest part: one tile's
    layer_token = 2 * 12 * m.hidden_size + 2 * 3 * m.intermediate_size * mlp_tokens / max(tokens, 1)  # bf16 bytes
    if lc.gradient_checkpointing:  # each layer's input kept (offloaded: the two a copy overlaps), one layer's whole
        kept = 2 if lc.offload_checkpoints else m.num_layers
        act = tokens * (kept * 2 * m.hidden_size + layer_token)
    else:
        act = tokens * m.num_layers * layer_token
    taught, teacher_hidden = taught_bytes(cfg, tokens)
    act += teacher_hidden
    adapters = adapter_params(cfg)
    if adapters:
        return LearnerMemory(
            weights=(2 * params + 2 * adapters) / GIB, optimizer=12 * adapters / n / GIB,
            reference=frozen_bytes(cfg, params, lora=True) / GIB,
            overhead=LEARNER_OVERHEAD_GIB, gradients=(2 * adapters + 4 * adapters / n) / GIB, activations=act / GIB,
            logits=logits_bytes(tokens, vocab, taught) / GIB, ipc_buffer=ipc_gib, adapters=adapters,
        )
    return LearnerMemory(
        weights=(2 * params / n if z3 else 2 * params) / GIB,
        optimizer=12 * params / n / GIB,
        reference=frozen_bytes(cfg, params, lora=False) / GIB,
        overhead=LEARNER_OVERHEAD_GIB,
        gradients=(6 * params / n if z3 else 2 * params + 4 * params / n) / GIB,
        activations=act / GIB,
        logits=logits_bytes(tokens, vocab, taught) / GIB,
        ipc_buffer=ipc_gib,
    )


def share_part(share: float, k: int) -> float:
    """One of k engines sharing a GPU: its part of the engines' memory share."""
    return share if k <= 1 else round(share / k, 4)


def engine_part(engine: EngineConfig, k: int) -> EngineConfig:
    """engine as one of k sharing a GPU, outside a plan (rlgen bench): vLLM's own share when unset."""
    if k <= 1:
        return engine
    return dataclasses.replace(engine, gpu_memory_utilization=share_part(engine.gpu_memory_utilization
                                                                          or VLLM_DEFAULT_SHARE, k))


@dataclass(frozen=True)
class _Budget:
    """One GPU's memory as the plan splits it, GiB. shares: the engines take a share of the GPU (vLLM)."""

    total: float  # the GPU
    shares: bool
    colocated: bool
    awake: bool  # colocated, the engine stays awake while the learner trains
    k: int  # engines per GPU
    extra: float  # engine processes past the first, outside the engines' share
    need: float  # the engines' floor: weights, one sequence's KV cache and headroom
    train_room: float  # what the learner's peak may take
    ipc: float  # the resident IPC buffer colocated engines take weights from
    cap: float  # the most of a GPU an engine gets: its own default share


def _budget(cfg: RunConfig, spec: EngineSpec, model, colocated: bool) -> _Budget:
    hw = cfg.hardware
    total = hw.gpu.memory_gb * 1e9 / GIB if hw.gpus_per_node > 0 else 0.0
    shares = hw.gpus_per_node > 0 and spec.memory_share
    awake = colocated and shares and cfg.algo.async_steps > 0
    k = cfg.engine.engines_per_gpu if (colocated and shares) else 1
    extra = (k - 1) * ENGINE_PROCESS_GIB
    need = k * (sum(engine_floor_gib(cfg, model.weight_gib_bf16, model.kv_bytes_per_token)) + ENGINE_HEADROOM_GIB
                if shares else 0.0)
    if awake:  # the whole engine stays beside the training learner: what the config gives it, else its floor
        given = cfg.engine.gpu_memory_utilization
        train_room = AWAKE_SHARE * total - (given * total if given is not None else need) - extra
    else:
        train_room = TRAIN_SHARE * total - (k * ENGINE_ASLEEP_GIB if (colocated and shares) else 0.0)
    # colocated engines take the weights from a resident buffer of at most one bucket (sync.bucket_mb)
    adapters = cfg.learner.lora.enabled and cfg.learner.lora.sync == "adapter"  # no IPC buffer: adapters go by Ray
    ipc = min(model.weight_gib_bf16, cfg.sync.bucket_mb / 1024) if (colocated and shares and not adapters) else 0.0
    return _Budget(total, shares, colocated, awake, k, extra, need, train_room, ipc, spec.default_memory_share or 1.0)


def fit_memory(cfg: RunConfig, spec: EngineSpec, model, ranks: int, per_rank: int, colocated: bool,
               p: list[str]) -> tuple[RunConfig, list[Setting], MemorySplit | None]:
    """Fill algo.micro_batch_tokens and engine.gpu_memory_utilization when null, check that the learner and the
    engine fit, and describe the split. `model` is the plan's ModelSummary; problems go to p."""
    b = _budget(cfg, spec, model, colocated)
    if cfg.hardware.gpus_per_node and per_rank and (crowded := _no_room(cfg, b)):
        p.append(crowded)
        return cfg, [], None
    whole = per_rank * longest_sequence(cfg)  # a rank's rows at their longest: budget 0's micro-batch

    def mem(tokens: int) -> LearnerMemory:
        return learner_memory(cfg, model.params, model.vocab_size, ranks, tokens or whole, b.ipc)

    def fits(tokens: int) -> bool:
        return mem(tokens).peak <= b.train_room

    cfg, settings = _micro_batch_tokens(cfg, model, fits)
    tokens = cfg.algo.micro_batch_tokens
    if cfg.hardware.gpus_per_node == 0 or not per_rank:
        return cfg, settings + _engine_setting(cfg), None
    learner = mem(tokens)
    if learner.peak > b.train_room:
        p.append(_learner_too_big(cfg, learner, b.train_room, b.total, ranks, tokens, colocated, fits, b.awake))
        if b.awake:
            return cfg, settings, None
    if not b.shares:
        return cfg, settings + _engine_setting(cfg), _split_of(b, None, learner, tokens)
    fraction = _engine_share(cfg, b, learner, settings, p)
    if fraction is None:
        return cfg, settings, None
    cfg = set_key(cfg, "engine.gpu_memory_utilization", fraction)
    return cfg, settings, _split_of(b, fraction, learner, tokens)


def _no_room(cfg: RunConfig, b: _Budget) -> str | None:
    """Why the engines on a GPU leave its learner no memory at all while it trains, with the fix; None when they
    leave some (how much the learner needs is fit_memory's to check)."""
    limit = (AWAKE_SHARE if b.awake else TRAIN_SHARE) * b.total  # what engines and the training learner may use
    held = limit - b.train_room  # what the engines keep while the learner trains
    if b.train_room > 0 or not (b.k > 1 or b.awake):
        return None
    gpu, how = f"{cfg.hardware.gpu.memory_gb:g} GB", "awake: algo.async_steps>0" if b.awake else "asleep"
    if b.k > 1:
        return (f"engine.engines_per_gpu={b.k} puts {b.k} engines on each {gpu} GPU, which keep about {held:.0f} GiB "
                f"of it while the learner trains ({how}), more than the {limit:.0f} GiB that engines and learner "
                "may use together; lower engine.engines_per_gpu (1 or 2 is usual; left out, the plan picks).")
    given = cfg.engine.gpu_memory_utilization
    what = f"engine.gpu_memory_utilization={given}" if given is not None else f"model {cfg.model.name}'s engine"
    return (f"{what} keeps about {held:.0f} GiB of each {gpu} GPU while the learner trains, the engine staying awake "
            f"(algo.async_steps={cfg.algo.async_steps}), more than the {limit:.0f} GiB that engine and learner may "
            "use together; set algo.async_steps=0 (the engine sleeps while the learner trains)"
            + (", or lower engine.gpu_memory_utilization." if given is not None else "."))


def full_finetune_fits(cfg: RunConfig, spec: EngineSpec, model, ranks: int, per_rank: int,
                      colocated: bool) -> tuple[bool, float, float]:
    """(fits, peak GiB, room GiB): whether training the whole model fits a learner GPU with micro-batches of one
    longest row, beside a sleeping engine when colocated (the most room the learner can have)."""
    full = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, lora=dataclasses.replace(
        cfg.learner.lora, enabled=False)), algo=dataclasses.replace(cfg.algo, async_steps=0))
    b = _budget(full, spec, model, colocated)
    peak = learner_memory(full, model.params, model.vocab_size, ranks, longest_sequence(cfg), b.ipc).peak
    return peak <= b.train_room, peak, b.train_room


def longest_row_fits(cfg: RunConfig, spec: EngineSpec, model, ranks: int, colocated: bool) -> bool:
    """Whether a learner rank, at the config's sequence degree, holds a micro-batch of the longest row beside
    the engines as the config has them (the least a step needs)."""
    b = _budget(cfg, spec, model, colocated)
    return learner_memory(cfg, model.params, model.vocab_size, ranks, longest_sequence(cfg), b.ipc).peak <= b.train_room


def _split_of(b: _Budget, fraction: float | None, learner: LearnerMemory, tokens: int) -> MemorySplit:
    return MemorySplit(round(b.total, 2), fraction, round(learner.idle, 2), round(learner.peak, 2), tokens,
                       b.colocated, b.awake, b.k, learner.parts())


def _micro_batch_tokens(cfg: RunConfig, model, fits) -> tuple[RunConfig, list[Setting]]:
    """algo.micro_batch_tokens: the config's, or on GPUs the most tokens (a multiple of TOKEN_STEP, at least the
    longest row, up to the recipe's ceiling or the longest row if that is more) that fit the learner; on CPU the
    recipe's (0: a rank's rows in one micro-batch)."""
    if cfg.algo.micro_batch_tokens is not None:
        return cfg, [Setting("algo.micro_batch_tokens", cfg.algo.micro_batch_tokens, "config")]
    recipe = recipe_for(model.params)
    longest = longest_sequence(cfg)
    if cfg.hardware.gpus_per_node == 0 or recipe.micro_batch_tokens == 0:
        why = f"recipe {recipe.name}" + ("" if recipe.micro_batch_tokens else ": a rank's rows in one micro-batch")
        return set_key(cfg, "algo.micro_batch_tokens", recipe.micro_batch_tokens), [
            Setting("algo.micro_batch_tokens", recipe.micro_batch_tokens, why)]
    floor = -(-longest // TOKEN_STEP) * TOKEN_STEP
    top = max(recipe.micro_batch_tokens, floor)
    chosen = next((t for t in range(top, floor - 1, -TOKEN_STEP) if fits(t)), floor)
    why = (f"derived: the most packed tokens, from the longest row ({longest}) up to recipe {recipe.name}'s "
           f"{recipe.micro_batch_tokens}, that fit the learner GPU")
    return set_key(cfg, "algo.micro_batch_tokens", chosen), [Setting("algo.micro_batch_tokens", chosen, why)]


def _engine_share(cfg: RunConfig, b: _Budget, learner: LearnerMemory, settings: list[Setting],
                  p: list[str]) -> float | None:
    """engine.gpu_memory_utilization: awake beside the learner's peak, colocated beside the idle learner, or the
    engine's own default on GPUs of its own. None when the engine cannot fit (the problem is in p)."""
    if b.awake:
        return _awake_fraction(cfg, b, learner, settings, p)
    fraction = cfg.engine.gpu_memory_utilization
    if not b.colocated:
        if fraction is None:
            settings.append(Setting("engine.gpu_memory_utilization", b.cap,
                                    "derived: engines have their own GPUs (the engine's default share)"))
            return b.cap
        settings.append(Setting("engine.gpu_memory_utilization", fraction, "config"))
        return fraction
    hw, k = cfg.hardware, b.k
    derived = _share(AWAKE_SHARE * b.total - learner.idle - b.extra, b.total, b.cap)
    if fraction is None:
        if derived * b.total < b.need:
            p.append(
                f"colocated, the learner holds about {learner.idle:.1f} GiB of each {hw.gpu.memory_gb:g} GB "
                f"GPU even between steps, which leaves the engine{_ks(k)} {max(derived, 0) * b.total:.1f} GiB, "
                f"less than the {b.need:.1f} GiB {_its(k)} weights and one {cfg.engine.max_model_len}-token "
                f"sequence need; {_fewer(k)}spread the learner over more GPUs with learner.zero_stage=3, "
                "give engines their own GPUs (hardware.colocated=false), or use a smaller model."
            )
            return None
        settings.append(Setting("engine.gpu_memory_utilization", derived,
                                f"derived: what the idle learner ({learner.idle:.1f} GiB) leaves of "
                                f"{AWAKE_SHARE:.0%} of the GPU" + _split(k, derived)))
        return derived
    settings.append(Setting("engine.gpu_memory_utilization", fraction, "config"))
    if fraction * b.total + learner.idle + b.extra > AWAKE_SHARE * b.total + 1e-9:
        p.append(
            f"engine.gpu_memory_utilization={fraction} asks for {fraction * b.total:.1f} GiB of a GPU where "
            f"the learner already holds about {learner.idle:.1f} GiB between steps; leave it unset "
            f"(the plan derives {max(derived, 0.05):.2f}) or set it to {max(derived, 0.05):.2f} or less."
        )
    return fraction


def _ks(k: int) -> str:
    return f"s ({k} per GPU)" if k > 1 else ""


def _its(k: int) -> str:
    return f"their {k} sets of" if k > 1 else "its"


def _fewer(k: int) -> str:
    return "lower engine.engines_per_gpu, " if k > 1 else ""


def _split(k: int, fraction: float) -> str:
    """How a derived share is split between the engines on a GPU ("" for one engine)."""
    if k == 1:
        return ""
    return (f", less {k - 1} x {ENGINE_PROCESS_GIB:g} GiB for the engine processes past the first; split between "
            f"{k} engines, {fraction / k:.3f} each")


def _awake_fraction(cfg: RunConfig, b: _Budget, learner: LearnerMemory, settings: list[Setting],
                    p: list[str]) -> float | None:
    """Colocated with async_steps > 0: the engine's share, beside the learner at its peak. Both stay under
    AWAKE_SHARE of the GPU: the learner's caching allocator holds its peak between steps, and NCCL allocates
    its buffers outside it at the first collective (a checkpoint's barrier on one rank), which failed on one
    H100 with the engine at what the peak left of TRAIN_SHARE."""
    k, total, need = b.k, b.total, b.need
    derived = _share(AWAKE_SHARE * total - learner.peak - b.extra, total, b.cap)
    fraction = cfg.engine.gpu_memory_utilization
    if fraction is None:
        if derived * total < need:
            p.append(
                f"colocated with algo.async_steps={cfg.algo.async_steps}, the engine stays awake while the learner "
                f"trains, and the learner's peak of about {learner.peak:.1f} GiB leaves the engine{_ks(k)} "
                f"{max(derived, 0) * total:.1f} GiB of the {total:.0f} GiB GPU, less than the {need:.1f} GiB "
                f"{_its(k)} weights and one sequence need; {_fewer(k)}set algo.async_steps=0 (the engine sleeps "
                "while the learner trains), or lower algo.micro_batch_tokens."
            )
            return None
        settings.append(Setting("engine.gpu_memory_utilization", derived,
                                f"derived: what the learner's peak ({learner.peak:.1f} GiB) leaves of "
                                f"{AWAKE_SHARE:.0%} of the GPU, the engine staying awake (async_steps>0)"
                                + _split(k, derived)))
        return derived
    settings.append(Setting("engine.gpu_memory_utilization", fraction, "config"))
    if fraction * total < need:
        p.append(f"engine.gpu_memory_utilization={fraction} gives the engine{_ks(k)} {fraction * total:.1f} GiB, less "
                 f"than the {need:.1f} GiB {_its(k)} weights and one {cfg.engine.max_model_len}-token sequence need; "
                 f"raise it, {_fewer(k)}or lower engine.max_model_len.")
    return fraction


def _share(room: float, total: float, cap: float) -> float:
    """An engine's gpu_memory_utilization for `room` GiB of a `total` GiB GPU: rounded down to 0.05, at most the
    engine's own default share."""
    return min(cap, math.floor(room / total * 20) / 20)


def _engine_setting(cfg: RunConfig) -> list[Setting]:
    """engine.gpu_memory_utilization where no vLLM engine uses it: listed only when the config set it."""
    if cfg.engine.gpu_memory_utilization is not None:
        return [Setting("engine.gpu_memory_utilization", cfg.engine.gpu_memory_utilization, "config")]
    return []


def _learner_too_big(cfg: RunConfig, learner: LearnerMemory, room: float, total: float, ranks: int, tokens: int,
                     colocated: bool, fits, awake: bool = False) -> str:
    lc = cfg.learner
    fixes = []
    longest = longest_sequence(cfg)
    smaller = next((t for t in range((tokens or longest) - TOKEN_STEP, longest - 1, -TOKEN_STEP) if fits(t)), None)
    if smaller:
        fixes.append(f"algo.micro_batch_tokens={smaller}")
    if not lc.gradient_checkpointing:
        fixes.append("learner.gradient_checkpointing=true")
    if lc.zero_stage != 3 and ranks > 1:
        fixes.append("learner.zero_stage=3")
    if ranks > 1 and (lc.sequence_parallel or 1) < ranks:
        fixes.append(f"learner.sequence_parallel={ranks} (each rank holds a slice of every row)")
    fixes.append("more learner GPUs with learner.zero_stage=3" if ranks == 1 or lc.zero_stage == 3
                 else "more learner GPUs")
    fixes.append("shorter responses (algo.max_new_tokens)")
    if not cfg.learner.lora.enabled:
        fixes.append("LoRA adapters on the frozen base (learner.lora.enabled=true)")
    if awake:
        if cfg.engine.gpu_memory_utilization is not None:
            fixes.append(f"a lower engine.gpu_memory_utilization (now {cfg.engine.gpu_memory_utilization})")
        fixes.append("algo.async_steps=0 (the engine sleeps while the learner trains)")
    beside = " beside an awake engine" if awake else " beside a sleeping engine" if colocated else ""
    return (f"a learner rank needs about {learner.peak:.0f} GiB at its peak ({learner.parts()}), more than the "
            f"{room:.0f} GiB it can have of a {total:.0f} GiB GPU{beside}; use " + ", or ".join(fixes) + ".")


__all__ = ["LearnerMemory", "MemorySplit", "adapter_params", "block_linears", "engine_part", "fit_memory",
           "full_finetune_fits", "learner_memory", "longest_row_fits", "longest_sequence"]
