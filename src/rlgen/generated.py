"""What an engine's generate() returns: ``GenResult``, the same for every engine kind and for generate_some(),
episodes and the end of a stream. It crosses Ray as a pickled dataclass, and the wire of `rlgen serve` as JSON
(``to_json`` / ``from_json``, completions in ``completion_to_json``'s form)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rlgen.types import Completion

# (phase, start, end): a Phase's value and wall-clock seconds since the epoch, as engines report their work
SpanTuple = tuple[str, float, float]


def completion_to_json(c: Completion) -> dict[str, Any]:
    """A completion as `rlgen serve` answers it: tokens, logprobs, finish reason and versions (top logprobs when
    asked for)."""
    out = {"group_id": c.group_id, "prompt_ids": list(c.prompt_ids), "token_ids": list(c.token_ids),
           "logprobs": [float(x) for x in c.logprobs], "finish_reason": c.finish_reason, "version": c.version,
           "version_changes": [[int(i), int(v)] for i, v in c.version_changes]}
    if c.top_logprobs:  # JSON keys are strings
        out["top_logprobs"] = [{str(t): float(lp) for t, lp in pos.items()} for pos in c.top_logprobs]
    return out


def completion_from_json(d: dict[str, Any]) -> Completion:
    return Completion(group_id=int(d["group_id"]), prompt_ids=list(d["prompt_ids"]), token_ids=list(d["token_ids"]),
                      logprobs=list(d["logprobs"]), finish_reason=str(d["finish_reason"]), version=int(d["version"]),
                      version_changes=[(int(i), int(v)) for i, v in d.get("version_changes", [])],
                      top_logprobs=[{int(t): float(lp) for t, lp in pos.items()} for pos in d.get("top_logprobs", [])])


@dataclass
class GenResult:
    """One generate() (or generate_some()) call's answer from one engine."""

    completions: list[Completion]  # n per request, in request order
    version: int  # the engine's policy version when the call started
    spans: list[SpanTuple] = field(default_factory=list)  # what the engine did when: generate, and env for episodes
    env_s: float = 0.0  # multi-turn episodes: seconds the engine waited on environment calls with nothing to generate
    tail_from: float | None = None  # when the call's tail began (rlgen.types.tail_start); None: the engine can't say

    def spans_json(self, engine: int | None = None) -> list[dict[str, Any]]:
        """The spans as {"phase", "start", "end"} objects, each named with ``engine`` when given (a server's
        answer, which joins several engines' spans)."""
        tag = {} if engine is None else {"engine": int(engine)}
        return [{**tag, "phase": str(p), "start": float(a), "end": float(b)} for p, a, b in self.spans]

    @staticmethod
    def spans_from_json(items: Iterable[dict[str, Any]]) -> list[SpanTuple]:
        """spans_json()'s objects as (phase, start, end); an engine name in them is left out."""
        return [(str(s["phase"]), float(s["start"]), float(s["end"])) for s in items]

    def to_json(self, engine: int | None = None) -> dict[str, Any]:
        """The result as `rlgen serve`'s /generate answers it; env_s and tail_from only where the engine set them."""
        out: dict[str, Any] = {"completions": [completion_to_json(c) for c in self.completions],
                               "spans": self.spans_json(engine), "version": int(self.version)}
        if self.env_s:
            out["env_s"] = float(self.env_s)
        if self.tail_from is not None:
            out["tail_from"] = float(self.tail_from)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GenResult:
        tail = d.get("tail_from")
        return cls(completions=[completion_from_json(c) for c in d["completions"]], version=int(d["version"]),
                   spans=cls.spans_from_json(d.get("spans", [])), env_s=float(d.get("env_s", 0.0)),
                   tail_from=None if tail is None else float(tail))


__all__ = ["GenResult", "SpanTuple", "completion_from_json", "completion_to_json"]
