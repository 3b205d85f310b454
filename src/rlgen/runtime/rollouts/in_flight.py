"""Rollouts in flight: one step's generate() calls, spread over the engines, and their results. A checkpoint
keeps the results of flights generated ahead of the learner (async_steps > 0) as JSON, so a resumed run
trains on exactly the rollouts the stopped run would have."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rlgen.types import Completion, GenRequest


@dataclass
class InFlight:
    step: int
    prompts: Any  # rollout.StepPrompts
    shards: list[list[GenRequest]]  # per engine index; [] where an engine got no requests
    launch_version: int  # the policy version the engines were given before this generate()
    refs: dict[int, tuple[int, Any]] = field(default_factory=dict)  # engine index -> (incarnation, generate ref)
    updates: dict[int, tuple[int, Any]] = field(default_factory=dict)  # engine index -> (incarnation, update ref)
    results: dict[int, dict[str, Any]] = field(default_factory=dict)  # engine index -> generate() result
    update_spans: dict[int, list[Any]] = field(default_factory=dict)  # engine index -> its weight update's spans
    prepared: list[Completion] | None = None  # the completions as trained on (cut at stop strings), once prepared
    scoring: Any = None  # the scorer's handle, once prepared
    launched_at: float | None = None  # when its generate() calls went to the engines (None: restored, not sent)

    @property
    def samples(self) -> int:
        """Completions per prompt."""
        return next(reqs[0].sampling.n for reqs in self.shards if reqs)

    def completions(self) -> list[Completion]:
        return [c for i in sorted(self.results) for c in self.results[i]["completions"]]

    def to_json(self) -> dict[str, Any]:
        """The finished flight's results (prompts are re-derived from the step on resume)."""
        return {
            "step": self.step,
            "launch_version": self.launch_version,
            "results": {
                str(i): {
                    "completions": [dataclasses.asdict(c) for c in r["completions"]],
                    "spans": [list(s) for s in r.get("spans", [])],
                    "version": r.get("version"),
                }
                for i, r in self.results.items()
            },
        }


def results_from_json(data: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {
        int(i): {
            "completions": [Completion(**c) for c in r["completions"]],
            "spans": [tuple(s) for s in r["spans"]],
            "version": r.get("version"),
        }
        for i, r in data["results"].items()
    }
