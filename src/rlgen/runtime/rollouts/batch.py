"""Prompts -> GenRequests per engine; Completions + rewards -> a padded RolloutBatch (its advantages to come)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rlgen.config import RunConfig
from rlgen.tasks.base import Prompt, Task
from rlgen.types import Completion, GenRequest, RolloutBatch, SamplingParams

if TYPE_CHECKING:
    from rlgen.engines.episodes import EpisodeSpec


class PromptTooLongError(ValueError):
    pass


@dataclass
class StepPrompts:
    step: int
    prompts: list[Prompt]
    prompt_ids: list[list[int]]


def encode_prompts(step: int, task: Task, renderer, cfg: RunConfig, prompts: list[Prompt] | None = None) -> StepPrompts:
    """The step's prompts (task.prompts(step, algo.prompts_per_step) unless given) as token ids, rendered
    (rlgen.tasks.prompts.PromptRenderer) and held to task.max_prompt_tokens by task.long_prompts; the validation
    pass refuses what would not fit."""
    prompts = task.prompts(step, cfg.algo.prompts_per_step) if prompts is None else prompts
    ids = []
    for p in prompts:
        whole = renderer.ids(p.text)
        row = renderer.fit(whole)
        if row is None:
            raise PromptTooLongError(
                f"prompt {p.text[:60]!r} has {len(whole)} tokens, more than task.max_prompt_tokens="
                f"{cfg.task.max_prompt_tokens}; raise task.max_prompt_tokens (and engine.max_model_len) or shorten it."
            )
        if not row:
            raise PromptTooLongError(f"prompt {p.text!r} encodes to no tokens; every prompt needs at least one.")
        ids.append(row)
    return StepPrompts(step, prompts, ids)


def sampling_params(cfg: RunConfig, eos_ids: list[int], seed: int) -> SamplingParams:
    a = cfg.algo
    return SamplingParams(
        n=a.samples_per_prompt,
        temperature=a.temperature,
        top_p=a.top_p,
        max_new_tokens=a.max_new_tokens,
        stop_token_ids=tuple(eos_ids),
        seed=seed,
    )


def split_requests(sp: StepPrompts, sampling: SamplingParams, num_engines: int,
                   episode: Callable[[Prompt], EpisodeSpec] | None = None) -> list[list[GenRequest]]:
    """Round-robin whole groups over engines; group_id is the prompt's index in the step. episode(prompt): the
    EpisodeSpec its samples play (a multi-turn task), or None."""
    shards: list[list[GenRequest]] = [[] for _ in range(num_engines)]
    for i, ids in enumerate(sp.prompt_ids):
        spec = episode(sp.prompts[i]) if episode is not None else None
        shards[i % num_engines].append(GenRequest(tuple(ids), sampling, i, episode=spec))
    return shards


class RolloutCountError(RuntimeError):
    """A step's completions do not cover each prompt exactly n times (a lost or doubled request)."""


def check_complete(completions: list[Completion], sp: StepPrompts, n: int) -> None:
    """Every prompt of the step has exactly n completions: none lost, none counted twice (an engine restart
    re-sends requests, so this is checked on every step)."""
    counts = [0] * len(sp.prompt_ids)
    for c in completions:
        if not 0 <= c.group_id < len(counts) or (
                not c.own_prompt and list(c.prompt_ids) != list(sp.prompt_ids[c.group_id])):
            raise RolloutCountError(f"step {sp.step}: a completion belongs to no prompt of the step (group {c.group_id}).")
        counts[c.group_id] += 1
    wrong = {g: k for g, k in enumerate(counts) if k != n}
    if wrong:
        raise RolloutCountError(
            f"step {sp.step}: prompts must have {n} completions each, but {len(wrong)} do not "
            f"(group: count {dict(list(wrong.items())[:5])})."
        )


def build_batch(completions: list[Completion], rewards: list[float], pad_id: int,
                mask_truncated: bool = False) -> RolloutBatch:
    """Completions (any order) -> RolloutBatch sorted by group, and within a group by tokens. Prompts left-padded,
    responses right-padded. Its advantages are 0 here: a step computes them once, from the batch's rewards
    (rlgen.runtime.step.advantages).
    mask_truncated: a completion that ran into max_new_tokens (finish_reason "length") keeps its reward's place in
    its group's advantages but gets response mask 0, so it leaves the loss (DAPO's overlong filtering). An
    episode's response mask is its loss_mask: 1 on the policy's tokens, 0 on the environment's."""
    # by group, and within one by its tokens: the batch's order (and so every float sum over it) does not hang on
    # which engine answered first
    order = sorted(range(len(completions)), key=lambda i: (completions[i].group_id, completions[i].token_ids))
    comps = [completions[i] for i in order]
    rw = torch.tensor([rewards[i] for i in order], dtype=torch.float32)  # [N]
    n = len(comps)
    p_len = max(len(c.prompt_ids) for c in comps)
    r_len = max(max(len(c.token_ids) for c in comps), 1)
    input_ids = torch.full((n, p_len + r_len), pad_id, dtype=torch.long)  # [N, P+L]
    attention = torch.zeros((n, p_len + r_len), dtype=torch.long)  # [N, P+L]
    response_mask = torch.zeros((n, r_len), dtype=torch.float32)  # [N, L]
    engine_logprobs = torch.zeros((n, r_len), dtype=torch.float32)  # [N, L]
    token_versions = torch.zeros((n, r_len), dtype=torch.long)  # [N, L]
    for row, c in enumerate(comps):
        p, t = len(c.prompt_ids), len(c.token_ids)
        input_ids[row, p_len - p : p_len] = torch.tensor(c.prompt_ids, dtype=torch.long)
        attention[row, p_len - p : p_len] = 1
        if t:
            input_ids[row, p_len : p_len + t] = torch.tensor(c.token_ids, dtype=torch.long)
            attention[row, p_len : p_len + t] = 1
            if mask_truncated and c.finish_reason == "length":
                response_mask[row, :t] = 0.0
            elif c.loss_mask:  # an episode: the environment's tokens stay out of the loss
                response_mask[row, :t] = torch.tensor(c.loss_mask[:t], dtype=torch.float32)
            else:
                response_mask[row, :t] = 1.0
            engine_logprobs[row, :t] = torch.tensor(c.logprobs, dtype=torch.float32)
            token_versions[row, :t] = torch.tensor(c.token_versions(), dtype=torch.long)
    group_ids = torch.tensor([c.group_id for c in comps], dtype=torch.long)  # [N]
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_mask=response_mask,
        engine_logprobs=engine_logprobs,
        rewards=rw,
        advantages=torch.zeros(n, dtype=torch.float32),
        group_ids=group_ids,
        version=min(c.version for c in comps),
        prompt_len=p_len,
        token_versions=token_versions,
    )
