"""Rollouts in flight: one step's generate() calls, spread over the engines, and their results. A checkpoint
keeps the results of flights generated ahead of the learner (async_steps > 0) as JSON, so a resumed run
trains on exactly the rollouts the stopped run would have."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from rlgen.generated import GenResult, SpanTuple
from rlgen.plan.env_bound import EnvBound
from rlgen.types import Completion, GenRequest

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from rlgen.runtime.rollouts.batch import StepPrompts
    from rlgen.runtime.rollouts.carry import Carried, Resolved
    from rlgen.tasks.scoring import Pending
    from rlgen.types import JSONDict


class UpdateResult(TypedDict, total=False):
    """An engine's answer to a weight update, as the driver reads it."""

    actor: str
    version: int
    spans: list[SpanTuple]


@dataclass
class InFlight:
    step: int
    prompts: StepPrompts
    shards: list[list[GenRequest]]  # per engine index; [] where an engine got no requests
    launch_version: int  # the policy version the engines were given before this generate()
    # engine index -> (incarnation, generate ref), and (incarnation, update ref)
    refs: dict[int, tuple[int, ObjectRef[GenResult]]] = field(default_factory=dict)
    updates: dict[int, tuple[int, ObjectRef[UpdateResult]]] = field(default_factory=dict)
    results: dict[int, GenResult] = field(default_factory=dict)  # engine index -> generate() result
    update_spans: dict[int, list[SpanTuple]] = field(default_factory=dict)  # engine index -> its weight update's spans
    prepared: list[Completion] | None = None  # the completions as trained on (cut at stop strings), once prepared
    scoring: Pending | None = None  # the scorer's handle, once prepared
    launched_at: float | None = None  # when its generate() calls went to the engines (None: restored, not sent)
    # algo.partial_rollouts: the groups each engine must finish (None: all of them), the carried groups this flight
    # goes on with (by group id), the extra prompts it holds, and, once collected, its groups sorted out
    enough: list[int] | None = None
    carried: dict[int, Carried] = field(default_factory=dict)  # group id -> its group cut short before
    extra: int = 0
    resolved: Resolved | None = None

    @property
    def samples(self) -> int:
        """Completions per prompt (a carried group's continuations are requests of one sample each)."""
        return max(r.sampling.n for reqs in self.shards for r in reqs)

    def env_bound(self) -> EnvBound | None:
        """How long its episodes' environment calls may take on the engine that plays the most (None: it holds
        no episodes)."""
        spec = next((r.episode for reqs in self.shards for r in reqs if r.episode is not None), None)
        if spec is None:
            return None
        episodes = max(sum(r.sampling.n for r in reqs if r.episode is not None) for reqs in self.shards)
        return EnvBound(spec.env_timeout_s, spec.max_turns, episodes, spec.env_workers)

    def call(self, engine: ActorHandle, i: int) -> ObjectRef[GenResult]:
        """Engine i's generate() of its requests (generate_some() when the flight may cut groups short)."""
        if self.enough is None:
            return engine.generate.remote(self.shards[i])
        return engine.generate_some.remote(self.shards[i], self.enough[i])

    def trained(self) -> StepPrompts:
        """The prompts of the groups trained on: all of them, or, once the flight's groups are sorted out, those
        done."""
        if self.resolved is None:
            return self.prompts
        from rlgen.runtime.rollouts.batch import StepPrompts

        return StepPrompts(self.step, self.resolved.prompts, self.resolved.prompt_ids)

    def completions(self) -> list[Completion]:
        """The engines' completions; once the flight's groups are sorted out, those done only."""
        if self.resolved is not None:
            return list(self.resolved.completions)
        return [c for i in sorted(self.results) for c in self.results[i].completions]

    def to_json(self) -> JSONDict:
        """The finished flight's results (prompts are re-derived from the step on resume)."""
        return {
            "step": self.step,
            "launch_version": self.launch_version,
            "results": {
                str(i): {
                    "completions": [dataclasses.asdict(c) for c in r.completions],
                    "spans": [list(s) for s in r.spans],
                    "version": r.version,
                }
                for i, r in self.results.items()
            },
            "carried": {str(g): c.to_json() for g, c in self.carried.items()},
            "extra": self.extra,
        }


def results_from_json(data: JSONDict) -> dict[int, GenResult]:
    return {
        int(i): GenResult(completions=[Completion(**c) for c in r["completions"]], version=r.get("version"),
                          spans=[tuple(s) for s in r["spans"]])
        for i, r in data["results"].items()
    }
