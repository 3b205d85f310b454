"""The pace of flights launched ahead (rlgen.runtime.rollouts.pace): the even spacing of async_steps + 1 chains of
steps, from the driver's measures of generation (D) and of the rest of a step (TP)."""

from __future__ import annotations

import pytest

from rlgen.runtime.rollouts.pace import PACE_SHARE, PACE_WINDOW, Pace


def _measured(gen: list[float], rest: list[float]) -> Pace:
    pace, t = Pace(), 100.0
    for d, tp in zip(gen, rest):
        pace.launched(t)
        pace.collected(t, t + d, t + d)
        pace.step_began(t + d + tp)
        t += d + tp
    return pace


def test_the_spacing_is_the_chains_period_over_their_count():
    pace = _measured([4.0, 4.0], [1.0, 1.0])
    assert pace.spacing(1) == pytest.approx(PACE_SHARE * 5.0 / 2)
    assert pace.spacing(2) == pytest.approx(PACE_SHARE * 5.0 / 3)
    assert pace.spacing(0) is None  # on-policy: nothing runs ahead


def test_nothing_is_held_before_a_step_was_measured():
    pace = Pace()
    pace.launched(10.0)
    assert pace.spacing(1) is None and pace.wait_s(1, 10.1) == 0.0


def test_a_flight_right_after_the_last_waits_for_the_spacing_and_a_late_one_does_not():
    pace = _measured([4.0], [1.0])  # spacing 0.9 * 2.5 = 2.25
    pace.launched(200.0)
    assert pace.wait_s(1, 200.5) == pytest.approx(200.0 + PACE_SHARE * 2.5 - 200.5)
    assert pace.wait_s(1, 203.0) == 0.0


def test_a_training_bound_run_is_never_held():
    # D < TP: its steps begin TP apart, farther than (D + TP) / 2, so a launch at a step's start is never early
    gen, rest = 1.0, 3.0
    pace = _measured([gen] * 4, [rest] * 4)
    pace.launched(500.0)
    assert pace.wait_s(1, 500.0 + rest) == 0.0


def test_the_measures_are_the_medians_of_the_last_steps():
    pace = _measured([10.0] + [2.0] * PACE_WINDOW, [1.0] * (PACE_WINDOW + 1))
    assert pace.spacing(1) == pytest.approx(PACE_SHARE * 3.0 / 2)  # the first step's 10 s has left the window
    pace = _measured([2.0, 2.0, 2.0], [1.0, 9.0, 1.0])  # one step with an evaluation in its rest
    assert pace.spacing(1) == pytest.approx(PACE_SHARE * 3.0 / 2)


def test_a_restored_flight_is_not_timed():
    pace = Pace()
    pace.collected(None, 5.0, 5.0)
    pace.step_began(6.0)
    assert not pace.gen and list(pace.rest) == [1.0]
