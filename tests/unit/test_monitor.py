"""The circuit breaker: consecutive-window trips, actions, the non-finite halt, and the archive on disk."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlgen.config import BreakerAction, MonitorConfig
from rlgen.runtime.state.breaker import CircuitBreaker, archive
from rlgen.types import RolloutBatch

CLEAN = 1e-6
DRIFT = 0.5


def _metrics(kl: float, skipped: bool = False) -> dict:
    m = {
        "mismatch/k3_kl": kl,
        "mismatch/mean_abs_delta": 0.1,
        "mismatch/max_abs_delta": 0.9,
        "mismatch/frac_over_threshold": 0.25,
        "mismatch/tokens": 12,
        "loss": 0.3,
        "skipped": skipped,
    }
    if skipped:
        m["skip_reason"] = "non-finite gradient norm (nan) at step 0"
    return m


def _batch(rows: int = 4, p: int = 3, length: int = 5, seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, length)  # [N, L]
    mask[0, 3:] = 0
    return RolloutBatch(
        input_ids=torch.randint(0, 50, (rows, p + length), generator=g),
        attention_mask=torch.ones(rows, p + length, dtype=torch.long),
        response_mask=mask,
        engine_logprobs=-torch.rand(rows, length, generator=g) * mask,
        rewards=torch.rand(rows, generator=g),
        advantages=torch.randn(rows, generator=g),
        group_ids=torch.arange(rows) // 2,
        version=7,
        prompt_len=p,
    )


def _cfg(**kw) -> MonitorConfig:
    base = {"kl_threshold": 0.05, "window": 3, "action": BreakerAction.warn, "max_nonfinite_steps": 2}
    return MonitorConfig(**{**base, **kw})


def test_clean_steps_never_trip():
    breaker = CircuitBreaker(_cfg())
    assert all(breaker.update(s, _metrics(CLEAN)) is None for s in range(50))
    assert breaker.trips == 0 and breaker.metrics()["monitor/breach_streak"] == 0


def test_a_short_spike_does_not_trip_and_the_streak_resets():
    breaker = CircuitBreaker(_cfg(window=3))
    kls = [DRIFT, DRIFT, CLEAN, DRIFT, DRIFT, CLEAN, DRIFT]
    assert [breaker.update(s, _metrics(k)) for s, k in enumerate(kls)] == [None] * len(kls)
    assert breaker.metrics()["monitor/breach_streak"] == 1


def test_threshold_held_for_a_window_trips_then_rearms():
    breaker = CircuitBreaker(_cfg(window=3))
    events = [breaker.update(s, _metrics(DRIFT)) for s in range(7)]
    tripped = [s for s, e in enumerate(events) if e is not None]
    assert tripped == [2, 5]  # once per full window of breaching steps
    e = events[2]
    assert e.kind == "mismatch" and e.action is BreakerAction.warn and e.streak == 3
    assert "steps 0..2" in e.message and "kl_threshold=0.05" in e.message
    assert breaker.trips == 2


def test_threshold_is_strict_and_a_nonfinite_kl_breaches():
    breaker = CircuitBreaker(_cfg(window=2, kl_threshold=0.05))
    assert breaker.update(0, _metrics(0.05)) is None
    assert breaker.update(1, _metrics(0.05)) is None  # equal to the threshold is not above it
    assert breaker.update(2, _metrics(math.nan)) is None
    assert breaker.update(3, _metrics(math.inf)) is not None


def test_steps_without_mismatch_metrics_are_ignored():
    breaker = CircuitBreaker(_cfg(window=1))
    assert breaker.update(0, {"loss": 1.0}) is None


@pytest.mark.parametrize("action", list(BreakerAction))
def test_the_configured_action_is_returned(action, tmp_path):
    breaker = CircuitBreaker(_cfg(window=2, action=action), out_dir=tmp_path)
    breaker.update(0, _metrics(DRIFT), _batch(seed=0))
    event = breaker.update(1, _metrics(DRIFT), _batch(seed=1))
    assert event is not None and event.action is action
    written = (tmp_path / "breaker").exists()
    assert written == (action is BreakerAction.halt)  # only a halt archives
    if action is BreakerAction.tighten:
        assert "async_steps -> 0" in event.message


def test_halt_archives_every_batch_of_the_streak_and_a_report(tmp_path):
    breaker = CircuitBreaker(_cfg(window=2, action=BreakerAction.halt), out_dir=tmp_path)
    batches = [_batch(seed=s) for s in range(4)]
    assert breaker.update(0, _metrics(CLEAN), batches[0]) is None
    assert breaker.update(1, _metrics(DRIFT), batches[1]) is None
    event = breaker.update(2, _metrics(math.nan), batches[2])
    assert event is not None and event.action is BreakerAction.halt
    folder = tmp_path / "breaker" / "step_000002"
    assert event.report_path == str(folder / "report.json") and str(folder) in event.message
    assert sorted(p.name for p in folder.glob("*.pt")) == ["batch_000001.pt", "batch_000002.pt"]
    saved = torch.load(folder / "batch_000002.pt")
    for name in ("input_ids", "attention_mask", "response_mask", "engine_logprobs", "rewards", "advantages", "group_ids"):
        assert torch.equal(saved[name], getattr(batches[2], name)), name
    assert saved["version"] == 7 and saved["prompt_len"] == 3
    report = json.loads((folder / "report.json").read_text())  # valid JSON although k3 was nan
    assert report["event"]["action"] == "halt" and report["event"]["kind"] == "mismatch"
    assert [r["step"] for r in report["streak"]] == [1, 2]
    assert report["streak"][1]["metrics"]["mismatch/k3_kl"] == "nan"
    assert report["thresholds"]["window"] == 2


def test_halt_without_out_dir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    breaker = CircuitBreaker(_cfg(window=1, action=BreakerAction.halt))
    event = breaker.update(0, _metrics(DRIFT), _batch())
    assert event is not None and event.report_path is None
    assert list(tmp_path.iterdir()) == []


def test_a_skipped_step_warns_and_repeats_halt(tmp_path):
    breaker = CircuitBreaker(_cfg(max_nonfinite_steps=2, action=BreakerAction.warn), out_dir=tmp_path)
    first = breaker.update(0, _metrics(CLEAN, skipped=True), _batch())
    assert first is not None and first.kind == "nonfinite" and first.action is BreakerAction.warn
    assert "not applied" in first.message and "1 of monitor.max_nonfinite_steps=2" in first.message
    assert breaker.update(1, _metrics(CLEAN)) is None  # a good step resets the count
    assert breaker.update(2, _metrics(CLEAN, skipped=True)).action is BreakerAction.warn
    halt = breaker.update(3, _metrics(CLEAN, skipped=True), _batch())
    assert halt.kind == "nonfinite" and halt.action is BreakerAction.halt  # whatever monitor.action says
    report = json.loads(open(halt.report_path).read())
    assert [r["step"] for r in report["streak"]] == [2, 3]
    assert report["streak"][1]["metrics"]["skip_reason"].startswith("non-finite gradient")


def test_the_stronger_event_wins_and_both_messages_are_kept():
    breaker = CircuitBreaker(_cfg(window=1, action=BreakerAction.tighten, max_nonfinite_steps=3))
    event = breaker.update(0, _metrics(DRIFT, skipped=True))
    assert event.action is BreakerAction.tighten and event.kind == "mismatch"
    assert "Also: step 0 skipped" in event.message


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="monitor.window"):
        CircuitBreaker(_cfg(window=0))


def test_archive_writes_the_batch_and_a_summary(tmp_path):
    b = _batch()
    path = archive(b, 5, tmp_path / "post_mortem")
    report = json.loads(path.read_text())
    assert report["step"] == 5 and report["sequences"] == 4 and report["response_tokens"] == 18
    assert torch.equal(torch.load(tmp_path / "post_mortem" / "batch_000005.pt")["input_ids"], b.input_ids)


@settings(max_examples=200, deadline=None)
@given(breaches=st.lists(st.booleans(), max_size=40), window=st.integers(1, 5))
def test_trips_exactly_when_a_run_of_breaches_fills_a_window(breaches, window):
    breaker = CircuitBreaker(_cfg(window=window))
    run, expected, got = 0, [], []
    for step, bad in enumerate(breaches):
        run = run + 1 if bad else 0
        if run == window:
            expected.append(step)
            run = 0
        if breaker.update(step, _metrics(DRIFT if bad else CLEAN)) is not None:
            got.append(step)
    assert got == expected
