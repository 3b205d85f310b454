"""Messages that cross actor boundaries. Plain dataclasses; torch only where a tensor is the payload."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    # what servers offer beyond RL rollouts (rlgen serve's OpenAI routes); the defaults change nothing
    top_k: int = 0  # 0: no cut
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    logprobs: int = 0  # the most likely alternatives reported per sampled token (Completion.top_logprobs)
    # the most likely tokens reported per prompt position besides the prompt's own (Completion.prompt_logprobs);
    # None: no prompt logprobs; -1: the whole vocabulary
    prompt_logprobs: int | None = None

    def plain(self) -> bool:
        """No sampling field beyond temperature and top-p is in use."""
        return (self.top_k, self.min_p, self.repetition_penalty, self.frequency_penalty, self.presence_penalty,
                self.logit_bias) == (0, 0.0, 1.0, 0.0, 0.0, ())


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    group_id: int  # the prompt's index in the step; its n completions share it
    adapter: str | None = None  # a LoRA adapter the engine loaded by name; None: the engine's policy
    # a multi-turn task: the environment each of the n samples plays an episode against
    # (rlgen.engines.episodes.EpisodeSpec); None: one completion per sample
    episode: Any = None
    must_finish: bool = False  # generate_some() never cuts it short (a response carried as many steps as it may be)


@dataclass
class Completion:
    group_id: int
    prompt_ids: list[int]
    token_ids: list[int]  # sampled tokens, stop token included when one was sampled
    logprobs: list[float]  # engine logprob of each sampled token, len == len(token_ids)
    finish_reason: str  # "stop" | "length" | "abort" (generate_some() cut it short: carried into a later step)
    version: int  # policy version of the engine when it began sampling this completion
    # in-flight weight updates during sampling: (index of the first token sampled after the update, the new
    # policy version), in order; empty when every token came from `version`
    version_changes: list[tuple[int, int]] = field(default_factory=list)
    # per sampled token, the sampling.logprobs most likely tokens and their logprobs (empty unless asked for)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    # with sampling.prompt_logprobs, per prompt position: {token: (logprob, rank)} for the most likely tokens and the
    # prompt's own, of the model's distribution before temperature (as vLLM's); None at the first, which has none
    prompt_logprobs: list[dict[int, tuple[float, int]] | None] = field(default_factory=list)
    # an episode (a multi-turn task): per token of token_ids, 1 where the policy sampled it and 0 where the
    # environment wrote it (its logprob is 0 there); empty: every token is the policy's
    loss_mask: list[int] = field(default_factory=list)
    env_reward: float | None = None  # the episode's reward from its environment (the sum of its steps' rewards)
    turns: int = 0  # the policy's turns in the episode
    env_error: str = ""  # why the environment ended the episode early (raised, timed out, malformed): reward 0
    env_timed_out: bool = False  # it ended because an environment call ran past task.env_timeout_s (env_error says)
    own_prompt: bool = False  # the episode's environment wrote its prompt (an agent's first messages), not the task

    def token_versions(self) -> list[int]:
        """The policy version that sampled each token."""
        out = [self.version] * len(self.token_ids)
        for start, version in self.version_changes:
            out[start:] = [version] * max(len(out) - start, 0)
        return out


class Phase(StrEnum):
    generate = "generate"
    reward = "reward"
    wait = "wait"  # the learner waiting for a rollout batch
    train = "train"
    sync = "sync"  # weights leaving the learner or entering an engine
    idle = "idle"  # an engine waiting for weights
    env = "env"  # an engine waiting for its episodes' environment calls (multi-turn tasks)
    teacher = "teacher"  # a learner's teacher scoring its rows (on-policy distillation)


def covered_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals: the learner's send and the engines' receive of one
    weight update run side by side, and their wall time is not their sum."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


TAIL_QUANTILE = 0.9  # a generate() call's tail: after this fraction of its requests finished, until the last


def tail_start(finished: Iterable[float]) -> float | None:
    """When a generate() call's tail began: the time by which TAIL_QUANTILE of its requests (each its last sample)
    had finished. None for no requests."""
    times = sorted(finished)
    if not times:
        return None
    return times[min(len(times) - 1, math.ceil(TAIL_QUANTILE * len(times)) - 1)]


def version_changes(marks: list[tuple[int, int]], version: int, length: int) -> list[tuple[int, int]]:
    """A completion's version changes from the marks of the in-flight updates it lived through (tokens sampled
    before each, the new version), or of the steps a partial rollout was carried through: only those inside the
    completion that change its version."""
    out: list[tuple[int, int]] = []
    current = version
    for n, new in marks:
        if n >= length or new == current:
            continue
        if out and out[-1][0] == n:  # two updates before the next token: the later one counts
            out.pop()
        out.append((int(n), int(new)))
        current = new
    return out


@dataclass(frozen=True)
class Span:
    actor: str  # "engine0", "learner0", "driver"
    phase: Phase
    start: float  # wall clock, seconds since the epoch
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class StepTimeline:
    step: int
    spans: list[Span] = field(default_factory=list)

    def add(self, actor: str, phase: Phase, start: float, end: float) -> None:
        self.spans.append(Span(actor, Phase(phase), start, end))

    def add_spans(self, actor: str, spans: Iterable[tuple[str, float, float]]) -> None:
        """An actor's spans as every actor reports them: (phase, start, end), the phase by its name."""
        for phase, start, end in spans:
            self.add(actor, Phase(phase), start, end)

    def total(self, phase: Phase, actor_prefix: str = "") -> float:
        return sum(s.seconds for s in self.spans if s.phase == phase and s.actor.startswith(actor_prefix))

    def covered(self, phase: Phase) -> float:
        """The wall time during which any actor was in ``phase``: spans that overlap count once."""
        return covered_seconds((s.start, s.end) for s in self.spans if s.phase == phase)

    @property
    def start(self) -> float:
        return min((s.start for s in self.spans), default=0.0)

    @property
    def end(self) -> float:
        return max((s.end for s in self.spans), default=0.0)

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "spans": [
                {"actor": s.actor, "phase": s.phase.value, "start": s.start, "end": s.end} for s in self.spans
            ],
        }


@dataclass
class RolloutBatch:
    """One step's rollouts, padded. B = prompts, G = samples per prompt, P = prompt len, L = response len.

    Prompts are left-padded and responses right-padded, so every response starts at column P.
    """

    input_ids: torch.Tensor  # [B*G, P+L] long
    attention_mask: torch.Tensor  # [B*G, P+L] long; 1 on real prompt and response tokens
    response_mask: torch.Tensor  # [B*G, L] float; 1 on sampled response tokens
    engine_logprobs: torch.Tensor  # [B*G, L] float; 0 where response_mask is 0
    rewards: torch.Tensor  # [B*G] float
    advantages: torch.Tensor  # [B*G] float; group-normalised over the whole step before sharding
    group_ids: torch.Tensor  # [B*G] long
    version: int  # oldest policy version that sampled any row
    prompt_len: int  # P
    token_versions: torch.Tensor | None = None  # [B*G, L] long; the policy version that sampled each token
    # a learner rank's micro-batches, as lists of its rows (rlgen.microbatches); None: the learner packs its rows
    # into micro-batches of algo.micro_batch_tokens itself
    micro_rows: list[list[int]] | None = None

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The rows given (a learner rank's shard)."""
        return RolloutBatch(
            input_ids=self.input_ids[rows],
            attention_mask=self.attention_mask[rows],
            response_mask=self.response_mask[rows],
            engine_logprobs=self.engine_logprobs[rows],
            rewards=self.rewards[rows],
            advantages=self.advantages[rows],
            group_ids=self.group_ids[rows],
            version=self.version,
            prompt_len=self.prompt_len,
            token_versions=None if self.token_versions is None else self.token_versions[rows],
        )


@dataclass(frozen=True)
class StepResult:
    """One learner rank's train_step: what the driver acts on, typed, apart from the metrics it logs."""

    version: int  # the policy version after the step (applied updates)
    skip_reason: str | None  # why the update was not applied; None: it was
    spans: tuple[tuple[str, float, float], ...]  # (phase, start, end) of this rank's step
    metrics: dict[str, Any]  # loss, grad_norm, mismatch/*, ... (plain numbers; rlgen.learners.group merges them)
    rng_digest: str | None = None  # several ranks: a digest of this rank's RNG states after the step
    # precision=fp16: the step was skipped because its gradients overflowed the loss scale (dynamic loss scaling
    # at work, which lowers the scale), not for a non-finite loss or weights
    overflow: bool = False
    # how each metric merges over the learner group's ranks (rlgen.metrics.reduce: "sum", "max", "mean:<count>";
    # a key not here: rank 0's value), declared where the metric is made
    reductions: dict[str, str] = field(default_factory=dict)

    @property
    def skipped(self) -> bool:
        return self.skip_reason is not None

    def record(self) -> dict[str, Any]:
        """The metrics with the step's outcome beside them, as a step record logs them."""
        out = {**self.metrics, "version": self.version, "skipped": self.skipped}
        if self.overflow:
            out["overflow_skip"] = True
        return out | ({"skip_reason": self.skip_reason} if self.skipped else {})


# JSON data as json.loads gives it and json.dumps takes it: status.json, checkpoints' metadata, the markers of
# local Ray clusters, the fingerprints of clusters kept warm
JSONValue: TypeAlias = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
JSONDict: TypeAlias = dict[str, JSONValue]
