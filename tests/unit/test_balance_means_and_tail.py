"""The balance verdict over several steps is their mean, with their spread (a series that alternates says so), and
carrying the generation tail (algo.partial_rollouts) is advised only where the run's own tail metrics predict it
cuts the mean step: the tail the learner waited for and the next batch did not fill."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from rlgen.commands.sweep import to_markdown
from rlgen.metrics.balance import BalanceContext, BalanceTracker, Kind, StepBalance, measure_record, summarize
from rlgen.metrics.report import balance_summary, print_summary
from rlgen.metrics.tail_gain import PARTIAL_GAIN_FRAC, tail_wait_s
from rlgen.types import Phase, StepTimeline


def on_policy(step: int, gen: float, train: float, t0: float, **tail: float) -> dict:
    """A step that generates, then trains (the learner waits for the whole generation), with its tail metrics."""
    tl = StepTimeline(step)
    tl.add("learner0", Phase.wait, t0, t0 + gen)
    tl.add("engine0", Phase.generate, t0, t0 + gen)
    tl.add("learner0", Phase.train, t0 + gen, t0 + gen + train)
    rec = {"step": step, "response_tokens": 1000, "timeline": tl.to_dict()["spans"], "step_s": gen + train}
    rec.update({f"gen/{k}": v for k, v in tail.items()})
    return rec


def ahead(step: int, wait: float, train: float, t0: float, **tail: float) -> dict:
    """A step whose batch generated ahead, during the previous step: the learner waits only `wait` for its end."""
    tl = StepTimeline(step)
    tl.add("engine0", Phase.generate, t0 - 3.0, t0 + wait)
    tl.add("learner0", Phase.wait, t0, t0 + wait)
    tl.add("learner0", Phase.train, t0 + wait, t0 + wait + train)
    rec = {"step": step, "response_tokens": 1000, "timeline": tl.to_dict()["spans"], "step_s": wait + train}
    rec.update({f"gen/{k}": v for k, v in tail.items()})
    return rec


def run(pairs: list[tuple[float, float]], **tail: float) -> list[dict]:
    out, t = [], 1000.0
    for i, (gen, train) in enumerate(pairs):
        out.append(on_policy(i, gen, train, t, **tail))
        t += gen + train + 0.001
    return out


ALTERNATING = [(0.5, 0.5)] + [(3.0, 0.5), (0.2, 0.5)] * 4 + [(0.2, 0.5)]  # warm-up, then 4 long and 5 short steps


def test_the_run_verdict_is_the_mean_of_alternating_steps_and_says_they_alternate():
    v = summarize(run(ALTERNATING))
    long, short = 3.5, 0.7
    assert (v.steps, v.first_step, v.step) == (9, 1, 9)
    assert v.step_s == pytest.approx((4 * long + 5 * short) / 9)  # the mean step, 1.94 s
    # the spread leaves the run's last step out (nothing generates beside a run's last step): 4 long, 4 short
    assert v.step_median_s == pytest.approx((long + short) / 2)
    assert (v.step_min_s, v.step_max_s) == (pytest.approx(short), pytest.approx(long))
    assert v.spread == pytest.approx(long / short)
    # mean generation (4 x 3.0 + 5 x 0.2) / 9 = 1.44 s against 0.5 s of training: generation-bound (the medians,
    # 0.2 s against 0.5 s, said training-bound)
    assert v.kind == Kind.generation_bound.value
    assert v.ratio == pytest.approx((4 * 3.0 + 5 * 0.2) / 9 / 0.5)
    assert v.advice.endswith(" Steps alternate between 0.7 s and 3.5 s, which their mean hides.")
    even = summarize(run([(0.5, 0.5)] + [(1.0, 0.5), (1.1, 0.5)] * 4))
    assert even.spread == pytest.approx(1.6 / 1.5) and "alternate" not in even.advice


def test_the_rolling_verdict_carries_the_spread_of_its_window():
    tracker = BalanceTracker(warmup=1, window=4)
    vs = [tracker.update(r) for r in run(ALTERNATING)]
    assert vs[0].spread == 1.0 and "alternate" not in vs[0].advice  # warm-up: its own step only
    last = vs[-1]
    assert last.steps == 4 and last.spread == pytest.approx(3.5 / 0.7)
    assert last.step_s == pytest.approx((3.5 + 3 * 0.7) / 4)  # steps 6-9: one long, three short
    assert "Steps range from 0.7 s to 3.5 s" in last.advice  # its window ends on two short steps: no alternation


def test_the_printed_balance_says_means_the_steps_and_their_spread():
    recs = run(ALTERNATING)
    buf = io.StringIO()
    print_summary(recs, BalanceContext(num_engines=1), Console(file=buf, width=250))
    text = buf.getvalue()
    assert "balance over 9 step(s) (means over steps 1-9, steps spread 5.0x)" in text
    assert "1.94 s (median 2.1 s, 0.7-3.5 s)" in text
    assert "medians" not in text
    flat = balance_summary(recs)
    assert flat["spread"] == pytest.approx(5.0, rel=1e-6) and flat["step_median_s"] == pytest.approx(2.1)
    md = to_markdown([{**flat, "overrides": [], "status": "ok"}], Path("sweep"))
    assert "Verdicts are means over the steps past the first" in md and "medians" not in md
    assert "| steps spread |" in md and "| 5.0x |" in md


def test_the_saving_is_the_waited_tail_the_next_batch_did_not_fill():
    assert tail_wait_s(2.0, 3.0, 0.0) == 2.0  # waited through the whole tail
    assert tail_wait_s(2.0, 0.5, 0.0) == 0.5  # the batch was mostly done when the learner began to wait
    assert tail_wait_s(2.0, 3.0, 0.75) == pytest.approx(0.5)  # the next batch generated beside 3/4 of it
    assert tail_wait_s(2.0, 3.0, float("nan")) is None


def test_partial_rollouts_are_advised_where_the_step_waits_for_an_unfilled_tail():
    # on-policy, 4 s generating (2.5 s of it the tail, nothing beside it) and 1 s training
    recs = run([(4.0, 1.0)] * 4, tail_s=2.5, tail_filled=0.0)
    m = measure_record(recs[1])
    assert m.tail_wait_s == pytest.approx(2.5) and m.tail_filled == 0.0
    v = summarize(recs, BalanceContext(async_steps=1))
    assert v.partial_gain == pytest.approx(2.5 / 5.0)
    assert "algo.partial_rollouts=0.25" in v.advice
    assert "carrying the tail would cut the mean step by about 50%" in v.advice
    assert v.advice.index("partial_rollouts") < v.advice.index("shorten responses")  # the first fix named


def test_no_partial_advice_where_the_next_batch_filled_the_tail():
    for filled in (1.0, 0.85):  # all of it, or enough that what is left is under the threshold (7.5%)
        v = summarize(run([(4.0, 1.0)] * 4, tail_s=2.5, tail_filled=filled), BalanceContext(async_steps=1))
        assert v.partial_gain < PARTIAL_GAIN_FRAC
        assert "partial_rollouts" not in v.advice and "tail" not in v.advice


def test_no_partial_advice_where_the_learner_did_not_wait_for_the_tail():
    # the batch generated during the previous step; its 2.5 s tail ran then, and the learner waited 0.05 s
    recs, t = [], 1000.0
    for i in range(4):
        recs.append(ahead(i, 0.05, 4.0, t, tail_s=2.5, tail_filled=0.0))
        t += 4.06
    v = summarize(recs, BalanceContext(async_steps=1))
    assert v.kind == Kind.training_bound.value
    assert v.partial_gain == pytest.approx(0.05 / 4.05)
    assert "partial_rollouts" not in v.advice


def test_no_partial_advice_without_the_tail_metrics_or_with_partial_rollouts_on():
    no_fill = [{k: v for k, v in r.items() if k != "gen/tail_filled"} for r in run([(4.0, 1.0)] * 3, tail_s=2.5,
                                                                                  tail_filled=0.0)]
    v = summarize(no_fill)
    assert v.partial_gain is None and "partial_rollouts" not in v.advice
    assert summarize(run([(4.0, 1.0)] * 3)).partial_gain is None  # an engine that reports no tail
    on = summarize(run([(4.0, 1.0)] * 3, tail_s=2.5, tail_filled=0.0), BalanceContext(partial=True))
    assert on.partial_gain == pytest.approx(0.5) and "partial_rollouts" not in on.advice  # nothing new said


def test_the_gain_over_steps_is_their_mean_saving_over_their_mean_step():
    # every other step waits 2 s for an unfilled tail; the others wait for nothing of it
    t, recs = 1000.0, []
    for i in range(5):
        filled = 0.0 if i % 2 else 1.0
        recs.append(on_policy(i, 3.0, 1.0, t, tail_s=2.0, tail_filled=filled))
        t += 4.001
    v = summarize(recs)
    assert v.partial_gain == pytest.approx((2 * 2.0 + 2 * 0.0) / 4 / 4.0)  # 25%
    assert "about 25%" in v.advice
    assert StepBalance(0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 1).tail_wait_s is None
