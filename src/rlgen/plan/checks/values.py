"""Every single setting in its range, before any check that spans several: each failure names the key, what
it must be and a usual value. Pure: no torch, no Ray."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from rlgen.algo.registry import compares_groups, part_reads
from rlgen.config import ISMode, KLEstimator, KLPenalty, Level, LossAgg, OldLogprobs, RunConfig, TaskKind
from rlgen.tasks.env_task import episode_problems
from rlgen.tasks.rewards import RewardSpecError, resolve_reward

# The most steps a run may ask for: at the tiny CPU model's 0.1 s a step, ten million steps take 12 days, and a
# step on GPUs takes seconds (months to years). A larger number is a typo, not a run.
MAX_STEPS = 10_000_000
MAX_LR = 1.0  # a learning rate of 1 or more makes AdamW's steps as large as the weights: no model trains at it
MAX_TEMPERATURE = 10.0  # above this every token is about equally likely: sampling is noise
# Groups the walk for non-finite numbers leaves to their own command's checks (rlgen serve's).
OWN_CHECKS = ("serve",)


def check_values(cfg: RunConfig, p: list[str]) -> None:
    """Every single value in its range; each failure names the key, the allowed range and a usual value. A value
    that is not a finite number (nan, inf) gets that one sentence only."""
    p.extend(sentence for _, sentence in nonfinite(cfg))
    _check_run(cfg, p)
    _check_algo(cfg, p)
    _check_engine(cfg, p)
    _check_model(cfg, p)
    _check_task(cfg, p)
    p[:] = once_per_nonfinite(cfg, p)


def once_per_nonfinite(cfg: RunConfig, problems: list[str]) -> list[str]:
    """problems with only the first sentence about each non-finite value: the range checks after it would only
    say the same of nan or inf again."""
    bad = {key for key, _ in nonfinite(cfg)}
    seen: set[str] = set()
    kept = []
    for sentence in problems:
        key = sentence.split("=", 1)[0]
        if key in bad and key in seen:
            continue
        seen.add(key)
        kept.append(sentence)
    return kept


def nonfinite(cfg: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(key, sentence) for every float of the config that is nan or infinite, reward weights included."""
    for f in dataclasses.fields(cfg):
        key, value = prefix + f.name, getattr(cfg, f.name)
        if key in OWN_CHECKS:
            continue
        if dataclasses.is_dataclass(value):
            yield from nonfinite(value, key + ".")
        elif isinstance(value, float) and not math.isfinite(value):
            yield key, f"{key}={value} is not a finite number; give a finite one, or leave it out for the default."
        elif isinstance(value, dict):
            for name, weight in value.items():
                if isinstance(weight, float) and not math.isfinite(weight):
                    yield (f"{key}.{name}", f"{key}.{name}={weight} is not a finite number; give the reward a finite "
                           f"weight, e.g. ++{key}.{name}=1.0.")


def _check_run(cfg: RunConfig, p: list[str]) -> None:
    if cfg.steps < 1:
        p.append(f"steps={cfg.steps} must be at least 1; set steps=40 or more.")
    elif cfg.steps > MAX_STEPS:
        p.append(f"steps={cfg.steps} is more than the {MAX_STEPS:,} a run may take (at 0.1 s a step, ten million "
                 "steps take 12 days); give the number of steps to train, e.g. steps=1000.")
    for key in ("timeout_s", "startup_timeout_s"):
        if not getattr(cfg, key) > 0:
            p.append(f"{key}={getattr(cfg, key)} must be a positive number of seconds (default "
                     f"{getattr(RunConfig(), key):g}).")
    if not cfg.runtime.hang_timeout_s > 0:
        p.append(f"runtime.hang_timeout_s={cfg.runtime.hang_timeout_s} must be a positive number of seconds "
                 "(default 300).")
    if cfg.hardware.cpus_per_node < 1:
        p.append(f"hardware.cpus_per_node={cfg.hardware.cpus_per_node} must be at least 1.")
    if cfg.learner.zero_stage not in (2, 3):
        p.append(f"learner.zero_stage={cfg.learner.zero_stage} must be 2 or 3.")
    if cfg.sync.bucket_mb <= 0:
        p.append(f"sync.bucket_mb={cfg.sync.bucket_mb} must be > 0 (1024 is the default).")
    if cfg.sync.sleep_level not in (1, 2):
        p.append(f"sync.sleep_level={cfg.sync.sleep_level} must be 1 or 2.")
    if cfg.checkpoint.every < 0:
        p.append(f"checkpoint.every={cfg.checkpoint.every} must be >= 0 (0: checkpoints only at the end and on a stop).")
    if cfg.checkpoint.keep < 1:
        p.append(f"checkpoint.keep={cfg.checkpoint.keep} must be at least 1: a run keeps its newest checkpoint.")
    mon = cfg.monitor
    for key in ("window", "max_nonfinite_steps"):
        if getattr(mon, key) < 1:
            p.append(f"monitor.{key}={getattr(mon, key)} must be at least 1.")
    for key in ("kl_threshold", "delta_threshold"):
        if not getattr(mon, key) > 0:
            p.append(f"monitor.{key}={getattr(mon, key)} must be > 0 (the default is {getattr(RunConfig().monitor, key)}).")
    ev = cfg.eval
    if ev.every < 0:
        p.append(f"eval.every={ev.every} must be >= 0 (0: no eval).")
    if ev.samples < 1:
        p.append(f"eval.samples={ev.samples} must be at least 1 (1: greedy).")
    if ev.max_prompts < 0:
        p.append(f"eval.max_prompts={ev.max_prompts} must be >= 0 (0: every held-out prompt).")
    if not 0 <= ev.temperature <= MAX_TEMPERATURE:
        p.append(f"eval.temperature={ev.temperature} must be in [0, {MAX_TEMPERATURE:g}]; 0.6 is usual.")
    elif ev.samples > 1 and ev.temperature <= 0:
        p.append(f"eval.samples={ev.samples} draws several samples, which needs eval.temperature > 0 (0.6 is usual).")
    if cfg.resume is not None and not str(cfg.resume).strip():
        p.append("resume= is empty; give resume=auto or the run directory to continue, or leave it out.")


def _check_algo(cfg: RunConfig, p: list[str]) -> None:
    a = cfg.algo
    if a.prompts_per_step < 1:
        p.append(f"algo.prompts_per_step={a.prompts_per_step} must be at least 1.")
    _check_group_size(a, p)
    if a.max_new_tokens < 1:
        p.append(f"algo.max_new_tokens={a.max_new_tokens} must be at least 1.")
    if a.temperature < 0:
        p.append(f"algo.temperature={a.temperature} must be > 0; 1.0 samples the policy as it is.")
    elif a.temperature > MAX_TEMPERATURE:
        p.append(f"algo.temperature={a.temperature} is more than {MAX_TEMPERATURE:g}, where every token is about equally "
                 "likely; 1.0 samples the policy as it is.")
    elif a.temperature == 0:
        p.append(
            "algo.temperature=0 samples greedily, so every sample of a prompt is the same, GRPO's group "
            "advantages are all zero and nothing is learned; use a temperature around 1.0."
        )
    if not 0 < a.top_p <= 1:
        p.append(f"algo.top_p={a.top_p} must be in (0, 1]; 1 disables nucleus sampling.")
    if a.lr <= 0:
        p.append(f"algo.lr={a.lr} must be > 0.")
    elif a.lr >= MAX_LR:
        p.append(f"algo.lr={a.lr} must be less than {MAX_LR:g}: no model trains at it (1e-6 to 1e-3 are usual); leave it "
                 "out for the model size's recipe.")
    if a.weight_decay < 0:
        p.append(f"algo.weight_decay={a.weight_decay} must be >= 0.")
    if a.grad_clip < 0:
        p.append(f"algo.grad_clip={a.grad_clip} must be >= 0 (0 turns clipping off).")
    if a.clip_low < 0 or (a.clip_low >= 1 and a.policy_loss != "cispo"):
        p.append(f"algo.clip_low={a.clip_low} must be in [0, 1); 0.2 is usual (only the cispo policy loss takes "
                 ">= 1, for no lower bound).")
    if a.clip_high < 0:
        p.append(f"algo.clip_high={a.clip_high} must be >= 0; 0.2 is usual (0.28 in DAPO).")
    if a.async_steps is not None and a.async_steps < 0:
        p.append(f"algo.async_steps={a.async_steps} must be >= 0 (0 is strictly on-policy).")
    if a.tis_cap != 0 and a.tis_cap < 1:
        p.append(f"algo.tis_cap={a.tis_cap} must be 0 (off) or >= 1; 2 is a common choice.")
    if a.seq_mask_cap != 0 and a.seq_mask_cap < 1:
        p.append(f"algo.seq_mask_cap={a.seq_mask_cap} must be 0 (off) or >= 1.")
    _check_band(a, p)
    if a.kl_coef < 0:
        p.append(f"algo.kl_coef={a.kl_coef} must be >= 0.")
    _check_loss_options(a, p)
    if cfg.task.response_length_mean < 0:
        p.append(f"task.response_length_mean={cfg.task.response_length_mean} must be >= 0 (0: off; > 0: stop ids "
                 "that give a random-weight model responses of about this many tokens).")
    if a.micro_batch_tokens is not None and a.micro_batch_tokens < 0:
        p.append(f"algo.micro_batch_tokens={a.micro_batch_tokens} must be >= 0 (0: each rank's rows in one "
                 "micro-batch).")


def _check_group_size(a, p: list[str]) -> None:
    """Samples per prompt: at least 2 for an estimator that compares a prompt's samples, at least 1 otherwise, and
    2 for dynamic sampling, which drops the groups whose rewards are all equal (as a group of one always is)."""
    groups = compares_groups(a.advantage)
    if a.samples_per_prompt < (2 if groups else 1):
        why = (f": algo.advantage={a.advantage} compares the samples of a prompt, so it needs at least 2" if groups
               else " must be at least 1")
        p.append(f"algo.samples_per_prompt={a.samples_per_prompt}{why}; set algo.samples_per_prompt=8.")
    elif a.samples_per_prompt == 1 and a.dynamic_sampling:
        p.append("algo.dynamic_sampling=true drops every group whose rewards are all equal, and with "
                 "algo.samples_per_prompt=1 every group is one reward; set algo.samples_per_prompt=8 or "
                 "algo.dynamic_sampling=false.")


def _per_sequence_ratio(a) -> bool:
    """Whether the loss's ratio is per sequence: importance_level=sequence under a loss that reads it."""
    return a.importance_level == Level.sequence and part_reads("algo.policy_loss", a.policy_loss, "importance_level")


def _check_loss_options(a, p: list[str]) -> None:
    """The options of the loss, the advantages and dynamic sampling (docs/algorithms.md)."""
    if _per_sequence_ratio(a) and a.loss_agg != LossAgg.seq_mean_token_mean:
        p.append(f"algo.importance_level=sequence gives each sequence one ratio, but algo.loss_agg={a.loss_agg} weighs "
                 "a sequence by its length; set algo.loss_agg=seq_mean_token_mean (as algo=gspo does).")
    _check_is_and_kl(a, p)
    if a.entropy_coef < 0:
        p.append(f"algo.entropy_coef={a.entropy_coef} must be >= 0 (0: no entropy bonus).")
    if not 0 < a.entropy_top_frac <= 1:
        p.append(f"algo.entropy_top_frac={a.entropy_top_frac} must be in (0, 1] (0.2 keeps the 20% highest-entropy "
                 "tokens; 1 keeps all).")
    if a.max_gen_batches < 1:
        p.append(f"algo.max_gen_batches={a.max_gen_batches}: dynamic sampling needs at least 1 generation round per "
                 "step (1 generates no more, 3 is usual).")
    if a.overlong_penalty < 0:
        p.append(f"algo.overlong_penalty={a.overlong_penalty} must be >= 0 (1 is usual).")
    if (a.overlong_buffer or 0) < 0:
        p.append(f"algo.overlong_buffer={a.overlong_buffer} must be >= 0 (0: no length penalty).")
    elif a.max_new_tokens is not None and (a.overlong_buffer or 0) >= a.max_new_tokens > 0:
        p.append(f"algo.overlong_buffer={a.overlong_buffer} must be less than algo.max_new_tokens={a.max_new_tokens}; "
                 f"a fifth of it ({max(a.max_new_tokens // 5, 1)}) is usual.")


def _check_band(a, p: list[str]) -> None:
    """The rollout correction's band [tis_low, tis_cap]: a lower end below 1 that something reads."""
    if not 0 <= a.tis_low < 1:
        p.append(f"algo.tis_low={a.tis_low} must be in [0, 1): the band's lower end (0: none; IcePop's is 0.5).")
    uses = [k for k, on in (("algo.tis_low", a.tis_low > 0), ("algo.tis_seq_reject", a.tis_seq_reject)) if on]
    if uses and a.tis_cap <= 0:
        p.append(f"{' and '.join(uses)} need the band's upper end, algo.tis_cap > 0 (2 is common, 5 is IcePop's).")
    elif a.tis_low > 0 and a.tis_mode == ISMode.truncate and not a.tis_seq_reject:
        p.append(f"algo.tis_low={a.tis_low} is read only by algo.tis_mode=mask (tokens outside [tis_low, tis_cap] "
                 "leave the loss) or algo.tis_seq_reject=true (sequences with such a token leave it); truncation "
                 "has no lower end. Set one of them, or algo.tis_low=0.")


def _check_is_and_kl(a, p: list[str]) -> None:
    """Combinations whose maths is not what their names say."""
    if a.tis_cap > 0 and a.tis_level == Level.sequence and not _per_sequence_ratio(a) \
            and a.old_logprobs == OldLogprobs.engine:
        if part_reads("algo.policy_loss", a.policy_loss, "importance_level"):
            ratio, fix = ("algo.importance_level=token", "set algo.importance_level=sequence (with "
                          "algo.loss_agg=seq_mean_token_mean), ")
        else:  # a loss whose ratio is always per token
            ratio, fix = f"algo.policy_loss={a.policy_loss} (a ratio per token)", "set "
        p.append(f"algo.tis_level=sequence with {ratio} and algo.old_logprobs=engine is not sequence-level IS: "
                 "each token's ratio still carries its own engine/trainer mismatch and only the cap is per "
                 f"sequence; {fix}algo.old_logprobs=trainer (a separate per-sequence weight), or "
                 "algo.tis_level=token.")
    if a.kl_coef > 0 and a.kl_penalty == KLPenalty.loss and a.kl_estimator == KLEstimator.k1 \
            and not a.kl_bias_correction:
        p.append("algo.kl_estimator=k1 in the loss has zero expected gradient (E[grad log pi] = 0 on the policy's "
                 "samples), so it adds only noise; use algo.kl_estimator=k3 (or k2), set "
                 "algo.kl_bias_correction=true, or put it in the reward with algo.kl_penalty=reward.")


ENGINE_DTYPES = ("float32", "bfloat16", "float16", "half", "auto")


def _check_engine(cfg: RunConfig, p: list[str]) -> None:
    e = cfg.engine
    if e.tensor_parallel_size < 1:
        p.append(f"engine.tensor_parallel_size={e.tensor_parallel_size} must be at least 1.")
    if e.num_engines is not None and e.num_engines < 1:
        p.append(f"engine.num_engines={e.num_engines} must be at least 1, or null to fill the engine GPUs.")
    if e.max_lora_rank is not None and e.max_lora_rank < 0:
        p.append(f"engine.max_lora_rank={e.max_lora_rank} must be 0 (no adapters) or a LoRA rank such as 64, or null.")
    if e.engines_per_gpu is not None and e.engines_per_gpu < 1:
        p.append(f"engine.engines_per_gpu={e.engines_per_gpu} must be at least 1 (1: one engine per GPU).")
    if e.gpu_memory_utilization is not None and not 0 < e.gpu_memory_utilization <= 1:
        p.append(f"engine.gpu_memory_utilization={e.gpu_memory_utilization} must be in (0, 1]; 0.9 is usual.")
    if e.kv_cache_gib is not None and not e.kv_cache_gib > 0:
        p.append(f"engine.kv_cache_gib={e.kv_cache_gib} must be above 0, or null (the plan sizes it, or vLLM measures).")
    if e.max_num_seqs < 1:
        p.append(f"engine.max_num_seqs={e.max_num_seqs} must be at least 1.")
    if e.dtype is not None and e.dtype not in ENGINE_DTYPES:
        p.append(f"engine.dtype={e.dtype} is not one of {', '.join(ENGINE_DTYPES)}.")
    if e.max_restarts < 0:
        p.append(f"engine.max_restarts={e.max_restarts} must be >= 0 (0: a dead engine stops the run).")
    if not e.keep_warm_s >= 0:
        p.append(f"engine.keep_warm_s={e.keep_warm_s} must be >= 0 (0: engines stop with the run).")


def _check_model(cfg: RunConfig, p: list[str]) -> None:
    m = cfg.model
    sizes = {k: getattr(m, k) for k in ("hidden_size", "intermediate_size", "num_layers", "max_position_embeddings")}
    small = [f"model.{k}={v}" for k, v in sizes.items() if v < 1]
    if small:
        p.append(f"{', '.join(small)}: model sizes must be at least 1; pick a preset (model=tiny) or fix the value.")
    if m.vocab_size < 0:
        p.append(f"model.vocab_size={m.vocab_size} must be >= 0 (0: the tokenizer's size).")
    if m.warm_start_steps < 0:
        p.append(f"model.warm_start_steps={m.warm_start_steps} must be >= 0 (0: no warm start).")
    if not 0 < m.warm_start_lr < MAX_LR:
        p.append(f"model.warm_start_lr={m.warm_start_lr} must be in (0, {MAX_LR:g}); 3e-3 is the default.")
    if m.rope_theta <= 0:
        p.append(f"model.rope_theta={m.rope_theta} must be > 0 (10000 is usual).")
    if m.num_heads < 1 or m.hidden_size % m.num_heads:
        p.append(f"model.hidden_size={m.hidden_size} must divide by model.num_heads={m.num_heads}.")
    elif m.num_kv_heads < 1 or m.num_heads % m.num_kv_heads:
        p.append(f"model.num_heads={m.num_heads} must divide by model.num_kv_heads={m.num_kv_heads}.")


def _check_episode_bounds(t: Any, p: list[str]) -> None:
    p.extend(episode_problems(t))  # the words the task itself raises (preflight lists a sentence once)
    if t.max_total_tokens < 1:
        p.append(f"task.max_total_tokens={t.max_total_tokens} must be at least 1 (an episode's tokens after its "
                 "prompt).")
    if not t.env_timeout_s > 0:
        p.append(f"task.env_timeout_s={t.env_timeout_s} must be > 0 (30 is the default).")
    if t.env_workers < 1:
        p.append(f"task.env_workers={t.env_workers} must be at least 1 (16 is the default).")


def _check_task(cfg: RunConfig, p: list[str]) -> None:
    t = cfg.task
    if t.max_prompt_tokens < 1:
        p.append(f"task.max_prompt_tokens={t.max_prompt_tokens} must be at least 1.")
    if t.kind == TaskKind.jsonl and not t.path:
        p.append("task=jsonl needs a file: set task.path=/path/to/rows.jsonl (one {\"prompt\", \"answer\"} object per line).")
    if t.kind == TaskKind.dataset and not t.path:
        p.append(f"task={t.kind.value} needs data: set task.path=<a JSONL, JSON, Parquet or CSV file, or a folder of them>.")
    if not 0 <= t.eval_fraction < 1:
        p.append(f"task.eval_fraction={t.eval_fraction} must be in [0, 1); 0.05 sets aside 5% of the rows.")
    if t.reward_workers < 0:
        p.append(f"task.reward_workers={t.reward_workers} must be >= 0 (0: score in the driver).")
    if not t.reward_timeout_s > 0:
        p.append(f"task.reward_timeout_s={t.reward_timeout_s} must be > 0 (10 is the default).")
    if t.kind == TaskKind.env:
        _check_episode_bounds(t, p)
    if any(not s for s in t.stop):
        p.append("task.stop holds an empty string, which would end every response at once; remove it.")

    for name, weight in (t.rewards or {t.reward: 1.0}).items():
        try:
            resolve_reward(name, "task.rewards" if t.rewards else "task.reward")
        except RewardSpecError as err:
            p.append(str(err))
        if not isinstance(weight, (int, float)):
            p.append(f"task.rewards.{name}={weight} must be a number (its weight).")
    _check_reward_weights(t, p)


def _check_reward_weights(t: Any, p: list[str]) -> None:
    """At least one reward of task.rewards has a positive weight: each reward is in [0, 1], so with every weight 0
    the total is always 0, and with none above 0 the highest total is failing every reward (a negative weight is a
    penalty beside a reward to earn)."""
    weights = {k: w for k, w in (t.rewards or {}).items() if isinstance(w, (int, float))}
    if not weights or any(w > 0 for w in weights.values()):
        return
    named = " and ".join(f"task.rewards.{k}={w:g}" for k, w in weights.items())
    first = next(iter(weights))
    if not any(weights.values()):
        p.append(f"{named}: every weight is 0, so every reward would be 0 and nothing would be learned; give the "
                 f"rewards that count a weight, e.g. ++task.rewards.{first}=1.0.")
        return
    p.append(f"{named}: no reward has a positive weight, so the total is highest (0) with every reward failed and "
             f"the run would learn to fail them; give the reward to earn a positive weight, e.g. "
             f"++task.rewards.{first}=1.0 (a negative weight is a penalty beside it).")
