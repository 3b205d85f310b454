"""The choices of the config's enumerated settings (StrEnums): what a key may hold, by name. Imports nothing
heavy; ``rlgen.config.schema`` uses them in its dataclasses."""

from __future__ import annotations

from enum import StrEnum


class WeightsOver(StrEnum):
    """How a run sends new weights to a remote server's engines."""

    auto = "auto"  # nccl when the learners are on GPUs and the server runs vllm engines, else http
    http = "http"  # safetensors bytes in an HTTP request (CPU, tests, any server)
    nccl = "nccl"  # vLLM's NCCL weight transfer: learner rank 0 joins the server engines' group


class Transport(StrEnum):
    """How a run's new weights reach its engines (the plan picks it from the layout and the engine kind)."""

    ray_object_store = "ray_object_store"  # CPU, or hf engines: state dict through Ray's object store
    cuda_ipc = "cuda_ipc"  # colocated: CUDA IPC handles to the learner's tensors, engine sleeps/wakes
    nccl = "nccl"  # separate GPUs: a NCCL group from learner rank 0 to every engine
    http = "http"  # engine=remote: safetensors bytes to the server, from the learner through each engine's proxy
    lora_adapter = "lora_adapter"  # LoRA: each new adapter version (megabytes) to every engine; the base stays put


class Precision(StrEnum):
    """The 16-bit format a run generates and trains in on GPUs (docs/correctness.md, "Precision")."""

    bf16 = "bf16"  # engines in bfloat16; learners bf16 with fp32 master weights (the torch learner: float32)
    fp16 = "fp16"  # engines in float16; learners fp16 with fp32 master weights and dynamic loss scaling


class LossAgg(StrEnum):
    token_mean = "token_mean"  # every response token of the batch weighs the same (DAPO; the grpo preset's)
    seq_mean_token_mean = "seq_mean_token_mean"  # mean over a sequence's tokens, then over sequences (GRPO paper, GSPO)
    seq_mean_token_sum_norm = "seq_mean_token_sum_norm"  # token sum / max_new_tokens, mean over sequences (Dr. GRPO)


class ScaleRewards(StrEnum):
    group = "group"  # (r - group mean) / group std (GRPO)
    batch = "batch"  # (r - group mean) / the std of the whole batch's rewards
    none = "none"  # r - group mean (Dr. GRPO)


class DistillEstimator(StrEnum):
    """How on-policy distillation's reverse KL to the teacher trains the student (rlgen.algo.distill)."""

    sampled = "sampled"  # the sampled token's log pi_teacher - log pi_engine, added to its advantage (k1)
    full = "full"  # the whole vocabulary's KL at each response token, in the loss (the teacher on the learners)


class LaunchAhead(StrEnum):
    """When a flight ahead of the learner goes out (rlgen.runtime.step.generate), where the plan picks it
    (rlgen.plan.launch_ahead)."""

    step_start = "step_start"  # at the step's start, beside the step's own flight, paced so steps do not alternate
    own_in = "own_in"  # once the step's own flight is in: the learner's wait never shares the engines with it


class RewardStd(StrEnum):
    population = "population"  # divide by n
    unbiased = "unbiased"  # divide by n - 1 (TRL's convention)


class Level(StrEnum):
    token = "token"
    sequence = "sequence"


class ISMode(StrEnum):
    truncate = "truncate"  # weights above the cap count as the cap
    mask = "mask"  # tokens (or sequences) whose weight is above the cap leave the loss


class OldLogprobs(StrEnum):
    """The policy the PPO ratio's denominator (pi_old) comes from."""

    engine = "engine"  # the engine's sampling logprobs: engine/trainer mismatch and staleness go into the ratio
    trainer = "trainer"  # the trainer's own, recomputed without gradient before the step's update


class KLEstimator(StrEnum):
    k1 = "k1"  # log pi - log ref
    k2 = "k2"  # (log pi - log ref)^2 / 2
    k3 = "k3"  # exp(ref - pi) - (ref - pi) - 1


class KLPenalty(StrEnum):
    loss = "loss"  # kl_coef * KL added to the loss
    reward = "reward"  # kl_coef * the sequence's summed KL subtracted from its reward before the advantages


class TaskKind(StrEnum):
    arith = "arith"
    reverse = "reverse"
    jsonl = "jsonl"
    dataset = "dataset"  # local JSONL, JSON or Parquet through Hugging Face datasets
    env = "env"  # multi-turn: each sample an episode against task.env (docs/environments.md)


class PromptFormat(StrEnum):
    auto = "auto"  # chat when the tokenizer has a chat template, else raw
    chat = "chat"  # the tokenizer's chat template, with task.system_prompt, ending in the assistant's turn
    raw = "raw"  # the prompt text as it is


class AnswerFormat(StrEnum):
    plain = "plain"  # the answer field as it is
    gsm8k = "gsm8k"  # the part after "####" (GSM8K's solutions)
    boxed = "boxed"  # the last \boxed{...} (MATH's solutions)


class LongPrompts(StrEnum):
    reject = "reject"  # a prompt over task.max_prompt_tokens stops the run before it starts
    skip = "skip"  # such rows are left out (counted in the plan's notes)
    truncate = "truncate"  # keep the last task.max_prompt_tokens tokens (the end of a chat prompt stays whole)


class BreakerAction(StrEnum):
    warn = "warn"
    tighten = "tighten"  # drop async_steps to 0
    halt = "halt"  # write a report and archive the offending batch


class WandbMode(StrEnum):
    disabled = "disabled"
    offline = "offline"
    online = "online"


class ExistingRun(StrEnum):
    """What a new run does with a run directory that already holds another run (docs/durability.md)."""

    refuse = "refuse"  # stop before anything is written, in one sentence naming the run there and the choices
    new = "new"  # run in a folder of its own beside it (<dir>-2, -3, ...), named on the first line
    replace = "replace"  # delete the other run's files (metrics, checkpoints, final model, reports) first
