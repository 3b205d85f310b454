"""Partial rollouts (algo.partial_rollouts): a step's generation holds more groups than the step trains, and ends
once the step's groups are done; the groups still running are cut short (their samples keep the tokens, logprobs
and policy versions they had) and carried into the next step's generation, where each unfinished sample goes on
from where it stopped. A group carried algo.partial_max_steps times runs to its end. So no response is dropped
or shortened, and the engines never wait for a batch's longest responses: they fill the time with the next
step's groups."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from rlgen.tasks.base import Prompt
from rlgen.types import Completion, GenRequest, JSONDict, SamplingParams, version_changes

PARTIAL_ROUND = 1_000  # task.extra_prompts' round for the groups a step's generation holds beyond its own
CUT = "abort"  # the finish reason of a sample cut short


@dataclass
class Carried:
    """A group cut short: its n samples (those cut short end with finish reason "abort"), carried into a later
    step's generation."""

    prompt: Prompt
    prompt_ids: list[int]
    samples: list[Completion]
    steps: int  # how many steps' generations have cut it short
    source: int  # the step whose generation cut it short last

    def to_json(self) -> JSONDict:
        return {"prompt": dataclasses.asdict(self.prompt), "prompt_ids": list(self.prompt_ids),
                "samples": [dataclasses.asdict(c) for c in self.samples], "steps": self.steps, "source": self.source}

    @staticmethod
    def from_json(data: JSONDict) -> Carried:
        samples = [Completion(**c) for c in data["samples"]]
        for c in samples:  # JSON keeps lists where the completion had tuples
            c.version_changes = [tuple(x) for x in c.version_changes]
            c.top_logprobs = [{int(k): v for k, v in d.items()} for d in c.top_logprobs]
        return Carried(Prompt(**data["prompt"]), list(data["prompt_ids"]), samples, int(data["steps"]),
                       int(data["source"]))


def extra_groups(prompts_per_step: int, share: float, carried: int) -> int:
    """Groups to add to a step's generation beyond its own prompts and the carried ones, so that it holds
    ceil(prompts_per_step * share) more than it trains."""
    return max(0, math.ceil(prompts_per_step * share) - carried)


def quotas(groups_per_engine: list[int], want: int) -> list[int]:
    """Each engine's share of the groups a step trains (want), by the groups it was given: at least want in all."""
    total = sum(groups_per_engine)
    return [min(g, math.ceil(want * g / total)) if total else 0 for g in groups_per_engine]


def oldest_first(carried: list[Carried]) -> list[Carried]:
    """The carried groups, those cut short most often first (in their order otherwise)."""
    return sorted(carried, key=lambda c: -c.steps)


def continuations(c: Carried, group_id: int, sampling: SamplingParams, max_steps: int) -> list[GenRequest]:
    """The group's samples that were cut short, each a request of one sample that goes on from its tokens (its own
    seed; what is left of max_new_tokens); they must finish once the group has been carried max_steps times."""
    out = []
    for k, s in enumerate(c.samples):
        if s.finish_reason != CUT:
            continue
        seed = None if sampling.seed is None else (sampling.seed * 31 + (k + 1) * 104_729) % (2**31 - 1)
        more = dataclasses.replace(sampling, n=1, seed=seed, max_new_tokens=sampling.max_new_tokens - len(s.token_ids))
        out.append(GenRequest(tuple(c.prompt_ids) + tuple(s.token_ids), more, group_id,
                              must_finish=c.steps >= max_steps))
    return out


def stitch(part: Completion, more: Completion) -> Completion:
    """A sample cut short, and its continuation: one completion of part's prompt. Its version changes are part's,
    then the continuation's version from its first token, then the continuation's own, shifted past part's tokens."""
    n = len(part.token_ids)
    marks = [*part.version_changes, (n, more.version), *((n + k, v) for k, v in more.version_changes)]
    return dataclasses.replace(
        part, token_ids=part.token_ids + more.token_ids, logprobs=part.logprobs + more.logprobs,
        top_logprobs=part.top_logprobs + more.top_logprobs if part.top_logprobs or more.top_logprobs else [],
        finish_reason=more.finish_reason,
        version_changes=version_changes(marks, part.version, n + len(more.token_ids)))


@dataclass
class Resolved:
    """A generation's groups sorted out: those done (their completions, group ids 0.. in order, and prompts), and
    those cut short."""

    completions: list[Completion]
    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    cut: list[Carried]
    metrics: dict[str, float]


def resolve(step: int, prompts: list[Prompt], prompt_ids: list[list[int]], carried: dict[int, Carried],
            completions: list[Completion]) -> Resolved:
    """Sort one generation's completions by group: a carried group's continuations (in the order of its samples
    that were cut short) are stitched onto them. Groups with a sample cut short are carried on; the others are
    done and numbered 0.. in group order."""
    by: dict[int, list[Completion]] = {}
    for c in completions:
        by.setdefault(c.group_id, []).append(c)
    done, cut, finished_carried, oldest, stalled = [], [], 0, 0, 0
    for g in range(len(prompts)):
        got = by.get(g, [])
        was = carried.get(g)
        if was is not None:
            if len(got) != sum(s.finish_reason == CUT for s in was.samples):
                raise ValueError(f"step {step}: carried group {g} got {len(got)} continuations for "
                                 f"{sum(s.finish_reason == CUT for s in was.samples)} samples cut short.")
            stalled += not any(c.token_ids for c in got)
            more = iter(got)
            samples = [stitch(s, next(more)) if s.finish_reason == CUT else s for s in was.samples]
        else:
            samples = got
        if any(s.finish_reason == CUT for s in samples):
            cut.append(Carried(prompts[g], list(prompt_ids[g]), samples, (was.steps if was else 0) + 1, step))
            continue
        if was is not None:
            finished_carried += 1
            oldest = max(oldest, was.steps)
        done.append((g, samples))
    out = [dataclasses.replace(s, group_id=k) for k, (_, samples) in enumerate(done) for s in samples]
    metrics = {"partial/carried": float(len(cut)), "partial/finished_carried": float(finished_carried),
               "partial/oldest": float(oldest), "partial/stalled": float(stalled),
               "partial/cut_tokens": float(sum(len(s.token_ids) for c in cut for s in c.samples))}
    return Resolved(out, [prompts[g] for g, _ in done], [list(prompt_ids[g]) for g, _ in done], cut, metrics)


__all__ = ["CUT", "PARTIAL_ROUND", "Carried", "Resolved", "continuations", "extra_groups", "oldest_first",
           "quotas", "resolve", "stitch"]
