"""The comparison of `rlgen validate`: run the cases through candidate and reference, pair their per-token
logprobs and reduce them to the rows of the table (k3 KL, |Δlogp|, greedy agreement) and the report."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rlgen.config import ValidateConfig
from rlgen.types import GenRequest, SamplingParams
from rlgen.validate.cases import DrawnRequest


@dataclass
class _Acc:
    """Paired per-token logprobs of one row of the table."""

    ref: list[float] = field(default_factory=list)
    cand: list[float] = field(default_factory=list)
    sequences: int = 0
    greedy_total: int = 0
    greedy_agree: int = 0

    def add(self, ref: list[float], cand: list[float]) -> None:
        self.ref.extend(ref)
        self.cand.extend(cand)
        self.sequences += 1


@dataclass
class CheckRow:
    name: str
    sequences: int
    tokens: int
    k3_kl: float
    mean_abs_delta: float
    max_abs_delta: float
    frac_over_threshold: float
    greedy_agreement: float | None
    tolerance: str
    passed: bool


@dataclass
class ValidationReport:
    engine: str
    candidate: str
    reference: str
    device: str
    settings: dict[str, Any]
    rows: list[CheckRow]
    cases: list[dict[str, Any]]
    worst_case: dict[str, Any] | None
    passed: bool
    seconds: float

    def row(self, name: str) -> CheckRow:
        return next(r for r in self.rows if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(dataclasses.asdict(self))


def jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def _metrics(ref: list[float], cand: list[float], threshold: float) -> dict[str, float]:
    import torch

    from rlgen.metrics.mismatch import mismatch_metrics

    r = torch.tensor([ref], dtype=torch.float64)  # [1, T]
    c = torch.tensor([cand], dtype=torch.float64)  # [1, T]
    return mismatch_metrics(r, c, torch.ones_like(r), threshold)


def _row(name: str, acc: _Acc, v: ValidateConfig, threshold: float, greedy: bool) -> CheckRow:
    m = _metrics(acc.ref, acc.cand, threshold)
    kl_ok = math.isfinite(m["k3_kl"]) and m["k3_kl"] <= v.kl_tolerance
    agreement = acc.greedy_agree / acc.greedy_total if greedy and acc.greedy_total else None
    greedy_ok = agreement is None or agreement >= v.min_greedy_agreement
    tol = f"{v.kl_tolerance:.0e}" + (f"/{v.min_greedy_agreement:g}" if agreement is not None else "")
    return CheckRow(
        name,
        acc.sequences,
        int(m["tokens"]),
        m["k3_kl"],
        m["mean_abs_delta"],
        m["max_abs_delta"],
        m["frac_over_threshold"],
        agreement,
        tol,
        kl_ok and greedy_ok,
    )


def _greedy_agrees(cand: list[int], ref: list[int], ref_own_lp: list[float], ref_on_cand: list[float], tie: float) -> bool:
    """Equal sequences agree; otherwise they agree when the first differing token is a near-tie for the
    reference (both prefixes are equal up to there, so the two reference logprobs share a context)."""
    for i, (a, b) in enumerate(zip(cand, ref)):
        if a != b:
            return abs(ref_own_lp[i] - ref_on_cand[i]) <= tie
    return len(cand) == len(ref)


def _temp_label(t: float) -> str:
    return "T=0 greedy" if t <= 0 else f"T={t:g}"


def _score_by_temperature(engine, prompts: list[list[int]], tokens: list[list[int]], temps: list[float]) -> list[list[float]]:
    """engine.score over rows of mixed temperatures, one call per temperature; rows come back in order."""
    out: list[list[float]] = [[] for _ in prompts]
    for t in sorted(set(temps)):
        idx = [i for i, x in enumerate(temps) if x == t]
        scored = engine.call("score", [prompts[i] for i in idx], [tokens[i] for i in idx], t)
        for i, row in zip(idx, scored):
            out[i] = list(row)
    return out


def compare(
    reference, candidate, cases: list[list[DrawnRequest]], v: ValidateConfig, stop_ids: tuple[int, ...],
    threshold: float, *, can_score: bool = False,
) -> tuple[list[CheckRow], list[dict[str, Any]]]:
    """Run every case through both engines; the table's rows and a per-case summary. The reference scores
    (ScoresTokens); can_score: the candidate's kind claims it too, which adds the "teacher-forced" row."""

    by_temp: dict[float, _Acc] = {}
    generated, forced = _Acc(), _Acc()
    summaries = []
    for k, case in enumerate(cases):
        requests = [
            GenRequest(
                r.prompt_ids,
                SamplingParams(r.n, r.temperature, 1.0, r.max_new_tokens, stop_ids, seed=v.seed * 100_003 + k),
                j,
            )
            for j, r in enumerate(case)
        ]
        comps = candidate.call("generate", requests).completions
        rows = [(r, j) for j, r in enumerate(case) for _ in range(r.n)]  # completion -> its request
        if len(comps) != len(rows):
            raise RuntimeError(f"case {k}: the candidate returned {len(comps)} completions for {len(rows)} samples.")
        prompts = [list(r.prompt_ids) for r, _ in rows]
        tokens = [list(c.token_ids) for c in comps]
        temps = [r.temperature for r, _ in rows]
        for c in comps:
            if len(c.logprobs) != len(c.token_ids):
                raise RuntimeError(f"case {k}: {len(c.logprobs)} logprobs for {len(c.token_ids)} tokens.")
        ref_lp = _score_by_temperature(reference, prompts, tokens, temps)
        case_acc = _Acc()
        for c, ref, t in zip(comps, ref_lp, temps):
            by_temp.setdefault(t, _Acc()).add(ref, c.logprobs)
            generated.add(ref, c.logprobs)
            case_acc.add(ref, c.logprobs)
        if can_score:
            for ref, cand in zip(ref_lp, _score_by_temperature(candidate, prompts, tokens, temps)):
                forced.add(ref, cand)
        greedy_idx = [j for j, r in enumerate(case) if r.temperature <= 0]
        if greedy_idx:
            ref_out = reference.call("generate", [requests[j] for j in greedy_idx]).completions
            ref_first, pos = {}, 0  # n samples per request come back; greedy ones are all the same
            for j in greedy_idx:
                ref_first[j] = ref_out[pos]
                pos += case[j].n
            for i, (r, j) in enumerate(rows):
                if r.temperature > 0:
                    continue
                ref_c = ref_first[j]
                ok = int(_greedy_agrees(tokens[i], ref_c.token_ids, ref_c.logprobs, ref_lp[i], v.tie_tolerance))
                for acc in (by_temp[r.temperature], case_acc):
                    acc.greedy_total += 1
                    acc.greedy_agree += ok
        m = _metrics(case_acc.ref, case_acc.cand, threshold)
        summaries.append(
            {
                "case": k,
                "requests": [dataclasses.asdict(r) | {"prompt_len": len(r.prompt_ids)} for r in case],
                "tokens": int(m["tokens"]),
                "k3_kl": m["k3_kl"],
                "max_abs_delta": m["max_abs_delta"],
                "greedy_agree": f"{case_acc.greedy_agree}/{case_acc.greedy_total}",
            }
        )
    rows_out = [_row(_temp_label(t), by_temp[t], v, threshold, greedy=t <= 0) for t in sorted(by_temp)]
    if can_score:
        rows_out.append(_row("teacher-forced", forced, v, threshold, greedy=False))
    rows_out.append(_row("all", generated, v, threshold, greedy=False))
    return rows_out, summaries


__all__ = ["CheckRow", "ValidationReport", "compare", "jsonable"]
