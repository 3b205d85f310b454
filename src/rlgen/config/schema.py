"""Config schema: one dataclass per Hydra config group, registered in Hydra's ConfigStore.

YAML files under ``conf/`` hold values only; each starts with ``defaults: [base_<group>, _self_]`` so a
misspelled key fails at composition. This module imports no torch, ray or vllm, so ``rlgen plan`` and the
config tests stay cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlgen.config.cards import GPUSpec, register_cards
from rlgen.config.choices import (  # noqa: F401 - re-exported: the schema's choices
    AnswerFormat,
    BreakerAction,
    DistillEstimator,
    ExistingRun,
    ISMode,
    KLEstimator,
    KLPenalty,
    LaunchAhead,
    Level,
    LongPrompts,
    LossAgg,
    OldLogprobs,
    Precision,
    PromptFormat,
    RewardStd,
    ScaleRewards,
    TaskKind,
    Transport,
    WandbMode,
    WeightsOver,
)
from rlgen.config.tools import BenchConfig, Perturb, Runner, ServeConfig, ValidateConfig  # noqa: F401 - re-exported


@dataclass
class EngineConfig:
    # an engine kind: hf, vllm, remote (a running `rlgen serve`), or one registered with
    # rlgen.engines.registry.register_engine; the plan checks it and reads what the kind can do from its spec
    kind: str = "hf"
    num_engines: int | None = None  # None: as many as the engine GPUs hold (1 on CPU)
    # colocated vLLM engines (TP 1) that share each GPU: they split the engines' memory share
    # (gpu_memory_utilization) evenly. At small models each engine core's CPU work, not the GPU, sets the decode
    # pace, so k engine cores keep the GPU busier. null: the plan derives it (2 up to 2B parameters where engines
    # may share a GPU, else 1).
    engines_per_gpu: int | None = None
    tensor_parallel_size: int = 1
    # null: the plan derives it (colocated: what the learner leaves free; own GPUs: vLLM's 0.9)
    gpu_memory_utilization: float | None = None
    # vllm: each engine's KV cache on each of its GPUs, GiB, taken as given (vLLM does not measure it). null: the
    # plan sizes it from the batch where engines share their GPUs, so they start side by side; else vLLM measures
    kv_cache_gib: float | None = None
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # null: task.max_prompt_tokens + algo.max_new_tokens
    max_num_seqs: int = 256
    # vllm: the tokens an engine step holds, prefill and decode together; null: 16,384 (rlgen's tuned default,
    # engines.vllm.args), 255 with deterministic=true (rlgen.plan.determinism)
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    # vllm: false (default) starts without torch.compile: whole decode steps run as CUDA graphs, prefills eagerly.
    # On one H100 that started a fresh host's engines in half the time and generated 1.18x faster than compiling
    # (docs/benchmarks.md). true: vLLM's torch.compile and piecewise graphs (its first start on a host compiles
    # for about 20 s; later starts read the cache)
    torch_compile: bool = False
    dtype: str | None = None  # null: from precision (bf16: bfloat16, fp16: float16); the hf engine on CPU: float32
    colocate: bool = False  # share the learners' GPUs; needs enable_sleep_mode
    enable_sleep_mode: bool = False
    seed: int = 0
    max_restarts: int = 3  # an engine actor that dies is re-created this many times; once more stops the run
    # a run on a local cluster that ends well keeps its engines this long (asleep where they sleep) for the next
    # run with the same engine settings, which starts from them; 0 stops them with the run
    keep_warm_s: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    # engine=remote: the server's address, its bearer token (or RLGEN_SERVE_TOKEN), and the weight path
    url: str | None = None
    token: str | None = None
    weights_over: WeightsOver = WeightsOver.auto
    # the largest LoRA rank the engines take (vllm sets room for adapters aside at start). null: the learner's rank
    # when it sends adapters (learner.lora.sync=adapter), else none. `rlgen serve` takes adapters
    # (/v1/load_lora_adapter, a trainer's adapters) when it is set, for example engine.max_lora_rank=64
    max_lora_rank: int | None = None


@dataclass
class AlgoConfig:
    kind: str = "grpo"  # the preset's name (conf/algo/<kind>.yaml), shown by the plan and the report
    # the maths, by registered name (rlgen.algo.registry; docs/algorithms.md gives every formula)
    advantage: str = "grpo"  # how rewards become advantages: grpo, rloo, reinforce_pp, reinforce_pp_baseline
    policy_loss: str = "ppo_clip"  # the loss on the learner: ppo_clip, cispo
    old_logprobs: OldLogprobs = OldLogprobs.engine  # pi_old of the ratio: the engine's, or the trainer's
    prompts_per_step: int = 8
    samples_per_prompt: int = 8  # GRPO group size
    max_new_tokens: int | None = None  # null: the model size's recipe (rlgen plan shows the value and its source)
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float | None = None  # null: the model size's recipe
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_low: float = 0.2  # PPO ratio clip: [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.2
    # the PPO ratio and its clip: per token (GRPO), or per sequence, the geometric mean of its tokens' (GSPO)
    importance_level: Level = Level.token
    kl_coef: float = 0.0  # > 0 loads a frozen reference model
    kl_estimator: KLEstimator = KLEstimator.k3
    kl_bias_correction: bool = False  # weigh each token's KL by pi / pi_engine (the engine sampled the token)
    kl_penalty: KLPenalty = KLPenalty.loss  # where kl_coef * KL goes: the loss, or the reward
    async_steps: int | None = None  # 0: strictly on-policy; k: engines may run k versions ahead; null: the plan picks
    # engine/trainer mismatch correction (rollout correction; docs/algorithms.md, conf/algo/correction/ presets):
    # the weight pi_trainer/pi_engine per token, or one per sequence (the geometric mean of its tokens'; needs
    # importance_level=sequence), truncated at tis_cap, or masked outside the band [tis_low, tis_cap]; 0 disables
    tis_cap: float = 2.0
    tis_level: Level = Level.token
    tis_mode: ISMode = ISMode.truncate
    tis_low: float = 0.0  # > 0, with tis_mode=mask: weights below it leave the loss too (a two-sided band)
    tis_seq_reject: bool = False  # a sequence with any token's weight outside [tis_low, tis_cap] leaves the loss
    seq_mask_cap: float = 0.0  # > 0: drop sequences whose mean |log ratio| exceeds log(seq_mask_cap)
    loss_agg: LossAgg = LossAgg.token_mean
    scale_rewards: ScaleRewards = ScaleRewards.group  # what the group-centred rewards are divided by
    reward_std: RewardStd = RewardStd.population
    entropy_coef: float = 0.0  # > 0: an entropy bonus, entropy_coef * the aggregated token entropy
    entropy_top_frac: float = 1.0  # < 1: only this fraction of each learner micro-batch's tokens, those of
    # highest entropy, get a policy gradient
    # drop groups whose rewards (after the overlong penalty) are all equal, and generate more to fill the batch
    dynamic_sampling: bool = False
    max_gen_batches: int = 3  # with dynamic sampling: at most this many generation rounds per step
    # > 0: responses within this many tokens of max_new_tokens lose up to overlong_penalty; null: max_new_tokens / 5
    overlong_buffer: int | None = 0
    overlong_penalty: float = 1.0
    mask_truncated: bool = False  # responses cut at max_new_tokens leave the loss (overlong filtering)
    micro_batch_tokens: int | None = None  # packed tokens a micro-batch, at most; 0: one; null: the most that fits
    # > 0: partial rollouts. A step's generation holds this share more groups than it trains and ends once the
    # step's are done; the groups still running carry into the next step's, and go on from where they stopped
    partial_rollouts: float = 0.0
    partial_max_steps: int = 1  # a group cut short this many times runs to its end in the next generation
    launch_ahead: LaunchAhead | None = None  # when a flight ahead goes out (LaunchAhead); null: the plan picks
    # on-policy distillation (algo=distill): a frozen teacher, a model folder or a model preset with the student's
    # tokenizer, scores every sampled token; each token's advantage mixes the task's with the negative reverse KL
    teacher: str | None = None
    distill_coef: float = 1.0  # A_t = (1 - c) A_task + c (log pi_teacher - log pi_engine); 1: pure distillation
    # sampled: the k1 term above, on the sampled token; full: the loss adds c times the reverse KL over the whole
    # vocabulary at each response token (docs/algorithms.md, section 11)
    distill_estimator: DistillEstimator = DistillEstimator.sampled


@dataclass
class HardwareConfig:
    name: str = "cpu"
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_node: int = 2
    gpu: GPUSpec = field(default_factory=GPUSpec)  # a preset's `gpu: <key>` fills it from rlgen.config.cards
    # The layout. null (the multi-GPU presets): the plan builds every layout the hardware can hold and runs the
    # one predicted fastest, keeping any of the three the config gives (docs/plan.md, "Layouts").
    engine_gpus: int | None = 0  # total over all nodes; engines fill nodes first
    learner_gpus: int | None = 0  # total over all nodes; learners take the GPUs after the engines
    colocated: bool | None = False  # engines and learners share every GPU (hybrid)
    learner_ranks: int = 1  # learner processes when no GPU is present


@dataclass
class ModelConfig:
    name: str = "tiny"
    path: str | None = None  # a local HF folder or a hub id; None builds from the preset
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    vocab_size: int = 0  # 0: the local tokenizer's size
    max_position_embeddings: int = 128
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    yarn_factor: float | None = None  # YaRN over max_position_embeddings; null: as needed (docs/plan.md); 1: off
    warm_start_steps: int = 0  # supervised steps on the task's demonstrations before RL
    warm_start_lr: float = 3e-3


class LearnerKind(StrEnum):
    auto = "auto"  # torch on CPU, deepspeed on GPU
    torch = "torch"
    deepspeed = "deepspeed"


# The linear layers of a Qwen2/Llama-style block: what LoRA adapts when learner.lora.target_modules is empty
LORA_BLOCK_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_DEFAULT_RANK = 16  # learner.lora.rank when LoRA is on and the rank is unset


class LoraSync(StrEnum):
    auto = "auto"  # adapters where the engine takes them (vLLM), merged weights elsewhere
    adapter = "adapter"  # engines keep the base and take each new adapter version (vLLM's LoRA)
    merged = "merged"  # the learner merges the adapters into the base and sends whole weights


@dataclass
class LoraConfig:
    """LoRA on the learners (PEFT): only the adapters train; the frozen base with the adapters off is the KL
    reference."""

    enabled: bool | None = None  # null: on when rank is set, or when full fine-tuning cannot fit the learner GPUs
    rank: int | None = None  # null: 16 when LoRA is on
    alpha: float | None = None  # null: 2 x rank
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=list)  # empty: every linear layer of the transformer blocks
    init: str | None = None  # a PEFT adapter folder to start from, trained on this base model
    sync: LoraSync = LoraSync.auto  # how the engines get the policy
    save_merged: bool = False  # final_model/merged: the base with the adapters merged in, beside the adapter


@dataclass
class LearnerConfig:
    kind: LearnerKind = LearnerKind.auto
    # DeepSpeed ZeRO stage: 2, or 3 when the weights plus optimizer states do not fit a GPU; null: the recipe's
    zero_stage: int | None = None
    gradient_checkpointing: bool | None = None  # DeepSpeed learner only; null: the recipe's
    attention: str = "auto"  # over packed rows: flash_attn, torch_varlen, sdpa_segments; auto: the fastest present
    sequence_parallel: int | None = None  # ranks sharing rows, each a slice of their tokens; null: docs/plan.md
    tiled_mlp: bool | None = None  # each MLP a tile of tokens at a time; null: where the longest row needs it
    offload_checkpoints: bool | None = None  # activation checkpoints in host memory; null: likewise
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class SyncConfig:
    bucket_mb: float = 1024.0  # packed transfer buffer and ZeRO-3 gather bucket; raised to the largest tensor
    sleep_level: int = 1  # colocated vLLM: 1 keeps a CPU copy of the weights while asleep, 2 drops them


@dataclass
class TaskConfig:
    kind: TaskKind = TaskKind.arith
    path: str | None = None  # jsonl and dataset: the data file (or folder of files)
    reward: str = "exact_match"  # a registered name or "module:function"; used when rewards is empty
    rewards: dict[str, float] = field(default_factory=dict)  # several rewards: name or module:function -> weight
    max_operand: int = 20  # arith: operands in [0, max_operand)
    length: int = 4  # reverse: letters per word
    alphabet: str = "abcdef"
    max_prompt_tokens: int | None = 16  # null: fitted to the model's positions, up to 64 (rlgen plan shows it)
    long_prompts: LongPrompts = LongPrompts.reject
    prompt_format: PromptFormat = PromptFormat.auto
    system_prompt: str | None = None  # chat format: the system turn
    stop: list[str] = field(default_factory=list)  # stop strings: a response ends after the first one it contains
    stop_token_ids: list[int] = field(default_factory=list)  # beside the model's own end-of-sequence ids
    response_length_mean: int = 0  # > 0: stop ids giving random weights RL-shaped lengths of this mean; 0: off
    # dataset: which split, which fields, how to build the prompt and read the reference answer
    split: str = "train"
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    template: str | None = None  # a format string over the row's fields, e.g. "{question}\nAnswer:"
    answer_format: AnswerFormat = AnswerFormat.plain
    eval_path: str | None = None  # held-out rows for eval: their own file ...
    eval_fraction: float = 0.0  # ... or this fraction of task.path, set aside with task.seed
    reward_workers: int = 0  # processes scoring rewards off the driver (0: in the driver)
    reward_timeout_s: float = 10.0  # a reward call that takes longer scores 0 (counted as reward/timeouts)
    # env: the environment (a registered name or module:Class), its keyword arguments, and the episode's bounds
    env: str | None = None
    env_args: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 4  # the policy's turns per episode at most
    max_total_tokens: int | None = 256  # the episode's tokens after the prompt (null: fitted to the model)
    env_timeout_s: float = 30.0  # a reset or step that takes longer is killed; its episode ends with reward 0
    env_workers: int = 16  # environment calls run at once, per engine (each episode's in a process of its own)
    seed: int = 0


@dataclass
class EvalConfig:
    """Held-out evaluation every `every` steps (0: none) and at the end: greedy with samples=1, else pass@k
    over `samples` samples at `temperature`."""

    every: int = 0
    samples: int = 1
    temperature: float = 0.6
    max_prompts: int = 0  # 0: every held-out prompt


@dataclass
class MonitorConfig:
    delta_threshold: float = 0.5  # |Δlogp| above this counts as a mismatched token
    kl_threshold: float = 0.05  # k3 KL above this for `window` consecutive steps trips the breaker
    window: int = 3
    action: BreakerAction = BreakerAction.warn
    max_nonfinite_steps: int = 2  # consecutive skipped steps before the run halts


class ShareMode(StrEnum):
    auto = "auto"  # probe each node: read the folder where it is visible, ship it where it is not
    path = "path"  # every node reads the same path (a shared file system)
    object_store = "object_store"  # ship folders to the other nodes through Ray's object store


@dataclass
class RayConfig:
    """Where the run's actors live. address null: a fresh local cluster (or the one RAY_ADDRESS names);
    "auto": the cluster this machine joined with `ray start`; "host:port" or "ray://host:10001"."""

    address: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)  # set in every actor on every node (NCCL_SOCKET_IFNAME ...)
    share: ShareMode = ShareMode.auto  # how actors on other nodes read the model and checkpoint folders


@dataclass
class CheckpointConfig:
    """Checkpoints under <run dir>/checkpoints/step_<k>/: one every `every` steps (0: none on the way), one at
    the end and one on a clean stop; the newest `keep` complete ones stay."""

    every: int = 50
    keep: int = 2
    # Periodic checkpoints written in the background: the learners copy their state to host memory and train on
    # while a thread writes it. null: on for learners on GPUs, off on CPU. The last one and a stop's are written
    # before the run ends either way.
    background: bool | None = None


@dataclass
class RuntimeConfig:
    """Faults while a run runs (docs/durability.md, "Faults while running")."""

    # A collective of the learner ranks (the gradient all-reduce, their rendezvous) or a weight update that has not
    # finished after this long is a hang: the run stops with a checkpoint and names the rank and the operation.
    # Well under NCCL's own 10-30 minutes, and far above a healthy collective (seconds, even for large models).
    hang_timeout_s: float = 300.0


@dataclass
class WandbConfig:
    mode: WandbMode = WandbMode.disabled
    project: str = "rlgen"
    entity: str | None = None


@dataclass
class RunConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    steps: int = 40
    seed: int = 0
    precision: Precision = Precision.bf16  # the 16-bit format engines and learners compute in on GPUs
    # true: vLLM's batch-invariant kernels, the learners' deterministic algorithms and completions in a fixed order,
    # so one seed gives the same tokens, logprobs and metrics (docs/correctness.md, "Deterministic runs")
    deterministic: bool = False
    timeout_s: float = 300.0  # every wait on an actor during the run gives up after this long
    startup_timeout_s: float = 900.0  # reserving resources and starting actors (vLLM compiles: minutes)
    cache_dir: str = "~/.cache/rlgen"  # built tiny models and tokenizers
    progress: bool = True
    # Continue a run from its newest complete checkpoint: "auto" (the newest with these settings) or a run directory.
    resume: str | None = None
    existing_run: ExistingRun = ExistingRun.refuse  # a run directory that holds another run: refuse, new, replace


_GROUPS: dict[str, type] = {
    "engine": EngineConfig,
    "algo": AlgoConfig,
    "hardware": HardwareConfig,
    "model": ModelConfig,
    "task": TaskConfig,
}


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=RunConfig)
    for group, node in _GROUPS.items():
        cs.store(group=group, name=f"base_{group}", node=node)
    register_cards(cs)


def to_run_config(cfg: Any) -> RunConfig:
    """Turn a composed DictConfig into the typed RunConfig (enums and nested dataclasses included)."""
    from omegaconf import OmegaConf

    if isinstance(cfg, RunConfig):
        return cfg
    # Through a plain container, so a key added with `+` that the schema lacks fails here too.
    merged = OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.to_container(cfg, resolve=True))
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, RunConfig)
    return obj
