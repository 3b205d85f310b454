"""The circuit breaker: watches each step's trainer/engine mismatch and non-finite skips, and acts.

Fed once per step with the learner's metrics. ``monitor.window`` steps in a row whose ``mismatch/k3_kl`` is over
``monitor.kl_threshold`` (or not finite) trip it, and it answers ``monitor.action``: warn, tighten (the caller
drops async_steps to 0) or halt. ``monitor.max_nonfinite_steps`` skipped steps in a row halt whatever the action;
an fp16 step the loss scale skipped for overflow (``overflow_skip``) is not one of them.
A halt archives the offending batches and a report under ``<out_dir>/breaker/step_<k>/``. docs/correctness.md
("Circuit breaker") has the rules and what the archive holds.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rlgen.config import BreakerAction, MonitorConfig

if TYPE_CHECKING:
    import torch

    from rlgen.types import JSONDict, JSONValue, RolloutBatch

KL_KEY = "mismatch/k3_kl"
CONTEXT_KEYS = (
    "mismatch/k3_kl",
    "mismatch/mean_abs_delta",
    "mismatch/max_abs_delta",
    "mismatch/frac_over_threshold",
    "mismatch/tokens",
    "tis_frac",
    "seq_masked_frac",
    "ratio_max",
    "loss",
    "grad_norm",
    "skipped",
    "skip_reason",
)


@dataclass(frozen=True)
class BreakerEvent:
    step: int
    kind: Literal["mismatch", "nonfinite"]
    action: BreakerAction
    streak: int  # breaching (or skipped) steps in a row, this one included
    message: str
    report_path: str | None = None  # set when the event halts and an out_dir was given

    def to_dict(self) -> JSONDict:
        d = asdict(self)
        d["action"] = self.action.value
        return d


def _plain(v: JSONValue) -> JSONValue:
    """JSON-safe: non-finite floats become strings rather than invalid JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def batch_tensors(batch: RolloutBatch) -> dict[str, torch.Tensor | int]:
    """The RolloutBatch as a dict of CPU tensors and ints (what ``archive`` saves; torch.load gives it back)."""
    return {
        "input_ids": batch.input_ids.detach().cpu(),  # [B*G, P+L]
        "attention_mask": batch.attention_mask.detach().cpu(),  # [B*G, P+L]
        "response_mask": batch.response_mask.detach().cpu(),  # [B*G, L]
        "engine_logprobs": batch.engine_logprobs.detach().cpu(),  # [B*G, L]
        "rewards": batch.rewards.detach().cpu(),  # [B*G]
        "advantages": batch.advantages.detach().cpu(),  # [B*G]
        "group_ids": batch.group_ids.detach().cpu(),  # [B*G]
        "version": int(batch.version),
        "prompt_len": int(batch.prompt_len),
    }


def save_batch(batch: RolloutBatch, path: str | Path) -> None:
    import torch

    torch.save(batch_tensors(batch), path)


def batch_summary(batch: RolloutBatch) -> dict[str, int | list[int]]:
    return {
        "sequences": batch.num_sequences,
        "response_tokens": batch.num_response_tokens,
        "input_ids_shape": list(batch.input_ids.shape),
        "version": int(batch.version),
        "prompt_len": int(batch.prompt_len),
    }


def archive(batch: RolloutBatch, step: int, out_dir: str | Path, report: JSONDict | None = None) -> Path:
    """Save ``batch`` as ``<out_dir>/batch_<step>.pt`` and write ``<out_dir>/report.json`` (``report``, or a
    summary of the batch when None). Creates the folder; returns the report's path."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    save_batch(batch, folder / f"batch_{step:06d}.pt")
    if report is None:
        report = {"step": step, "batch": f"batch_{step:06d}.pt", **batch_summary(batch)}
    path = folder / "report.json"
    path.write_text(json.dumps(_plain(report), indent=2) + "\n")
    return path


_RANK = {BreakerAction.warn: 0, BreakerAction.tighten: 1, BreakerAction.halt: 2}


def _merge(a: BreakerEvent | None, b: BreakerEvent | None) -> BreakerEvent | None:
    """One event for the step: the stronger action's, with both messages."""
    if a is None or b is None:
        return a or b
    strong, weak = (a, b) if _RANK[a.action] >= _RANK[b.action] else (b, a)
    return replace(strong, message=f"{strong.message}\nAlso: {weak.message}")


class CircuitBreaker:
    """Per-step state machine over the learner's metrics. ``out_dir`` None: halting writes nothing."""

    def __init__(self, cfg: MonitorConfig, out_dir: str | Path | None = None, keep_batches: bool = True):
        if cfg.window < 1:
            raise ValueError(f"monitor.window={cfg.window} must be at least 1.")
        self.cfg = cfg
        self.action = BreakerAction(cfg.action)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.keep_batches = keep_batches
        # (step, context metrics, batch or None) of the steps in the current streak
        self._breach: deque[tuple[int, JSONDict, RolloutBatch | None]] = deque(maxlen=cfg.window)
        self._skips: deque[tuple[int, JSONDict, RolloutBatch | None]] = deque(maxlen=max(cfg.max_nonfinite_steps, 1))
        self.trips = 0
        self.events: list[BreakerEvent] = []

    # -- the per-step call ----------------------------------------------------------------------------
    def update(self, step: int, metrics: Mapping[str, JSONValue], batch: RolloutBatch | None = None) -> BreakerEvent | None:
        """Feed one step's learner metrics (and, optionally, its batch, kept for the archive while the step
        is part of a streak). Returns the event to act on, or None."""
        context = {k: metrics[k] for k in CONTEXT_KEYS if k in metrics}
        kept = batch if self.keep_batches else None
        event = self._check_nonfinite(step, metrics, context, kept)
        mismatch = self._check_mismatch(step, metrics, context, kept)
        event = _merge(event, mismatch)
        if event is not None:
            self.events.append(event)
        return event

    def metrics(self) -> dict[str, int]:
        """Breaker state to log beside the step's metrics."""
        return {
            "monitor/breach_streak": len(self._breach),
            "monitor/skip_streak": len(self._skips),
            "monitor/trips": self.trips,
        }

    def state_dict(self) -> JSONDict:
        """The breaker's counts and streaks, for a checkpoint (the streaks' batches are not kept)."""
        return {
            "trips": self.trips,
            "breach": [[step, _plain(ctx)] for step, ctx, _ in self._breach],
            "skips": [[step, _plain(ctx)] for step, ctx, _ in self._skips],
            "events": [e.to_dict() for e in self.events],
        }

    def load_state_dict(self, state: JSONDict) -> None:
        self.trips = int(state.get("trips", 0))
        self._breach.clear()
        self._breach.extend((int(step), ctx, None) for step, ctx in state.get("breach", []))
        self._skips.clear()
        self._skips.extend((int(step), ctx, None) for step, ctx in state.get("skips", []))
        self.events = [
            BreakerEvent(**{**e, "action": BreakerAction(e["action"])}) for e in state.get("events", [])
        ]

    # -- the two checks -------------------------------------------------------------------------------
    def _check_mismatch(self, step, metrics, context, batch) -> BreakerEvent | None:
        kl = metrics.get(KL_KEY)
        if kl is None:
            return None
        kl = float(kl)
        if math.isfinite(kl) and kl <= self.cfg.kl_threshold:
            self._breach.clear()
            return None
        self._breach.append((step, context, batch))
        streak = len(self._breach)
        if streak < self.cfg.window:
            return None
        self.trips += 1
        first = self._breach[0][0]
        kls = ", ".join(f"{float(c.get(KL_KEY, math.nan)):.3g}" for _, c, _ in self._breach)
        msg = (
            f"mismatch breaker tripped at step {step}: k3 KL(engine || trainer) above monitor.kl_threshold="
            f"{self.cfg.kl_threshold:g} for {streak} steps in a row (steps {first}..{step}: {kls}); "
            f"max |Δlogp| {float(context.get('mismatch/max_abs_delta', math.nan)):.3g}, "
            f"{100 * float(context.get('mismatch/frac_over_threshold', math.nan)):.1f}% of tokens over "
            f"monitor.delta_threshold={self.cfg.delta_threshold:g}. "
        )
        if self.action is BreakerAction.warn:
            msg += "Action: warn (set monitor.action=tighten or halt to act on it)."
        elif self.action is BreakerAction.tighten:
            msg += "Action: tighten, async_steps -> 0 (strictly on-policy from here)."
        else:
            msg += "Action: halt. Check the engine against the reference with `rlgen validate engine=<kind>`."
        event = BreakerEvent(step, "mismatch", self.action, streak, msg)
        if self.action is BreakerAction.halt:
            event = self._write(event, self._breach)
        self._breach.clear()
        return event

    def _check_nonfinite(self, step, metrics, context, batch) -> BreakerEvent | None:
        if metrics.get("overflow_skip"):  # precision=fp16: the loss scale skipped the step and lowered itself
            return None  # neither non-finite nor a healthy step: the streak neither grows nor ends
        if not metrics.get("skipped"):
            self._skips.clear()
            return None
        self._skips.append((step, context, batch))
        streak = len(self._skips)
        reason = metrics.get("skip_reason") or "non-finite loss, gradient or weights"
        limit = max(self.cfg.max_nonfinite_steps, 1)
        if streak < limit:
            msg = (
                f"step {step} skipped: {reason}. The update was not applied and no weights were sent to the "
                f"engines ({streak} of monitor.max_nonfinite_steps={limit} in a row before the run halts)."
            )
            return BreakerEvent(step, "nonfinite", BreakerAction.warn, streak, msg)
        msg = (
            f"{streak} steps in a row skipped for non-finite values (last, step {step}: {reason}); no bad "
            "weights reached the engines. Lower algo.lr, tighten algo.grad_clip, or check the reward function."
        )
        return self._write(BreakerEvent(step, "nonfinite", BreakerAction.halt, streak, msg), self._skips)

    # -- halting --------------------------------------------------------------------------------------
    def _write(self, event: BreakerEvent, streak: deque) -> BreakerEvent:
        if self.out_dir is None:
            return event
        folder = self.out_dir / "breaker" / f"step_{event.step:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        rows = []
        for step, ctx, batch in streak:
            name = None
            if batch is not None:
                name = f"batch_{step:06d}.pt"
                save_batch(batch, folder / name)
            rows.append({"step": step, "metrics": ctx, "batch": name, **(batch_summary(batch) if batch else {})})
        report = {
            "event": event.to_dict(),
            "thresholds": {
                "kl_threshold": self.cfg.kl_threshold,
                "delta_threshold": self.cfg.delta_threshold,
                "window": self.cfg.window,
                "max_nonfinite_steps": self.cfg.max_nonfinite_steps,
                "action": self.action.value,
            },
            "streak": rows,
            "written_at": time.time(),
        }
        path = folder / "report.json"
        path.write_text(json.dumps(_plain(report), indent=2) + "\n")
        return replace(event, message=f"{event.message} Report and batches: {folder}", report_path=str(path))


__all__ = ["BreakerEvent", "CircuitBreaker", "archive", "batch_tensors", "save_batch"]
