"""rlgen.metrics.steady: a series of step seconds summed up as throughput (the mean step over the steady steps,
tokens per second, how far the steps spread), checked against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from rlgen.metrics.steady import SPREAD_LIMIT, Steady, ratio, steady


def test_the_mean_of_the_steady_steps_leaves_out_warmup_and_tail():
    s = steady([10.0, 2.0, 4.0, 6.0, 30.0], warmup=1, tail=1)  # kept: 2, 4, 6
    assert (s.steps, s.first) == (3, 1)
    assert s.mean_s == pytest.approx(4.0)
    assert (s.min_s, s.max_s) == (2.0, 6.0)
    assert s.spread == pytest.approx(3.0)
    assert s.median_s == pytest.approx(4.0)
    # population standard deviation of 2, 4, 6: sqrt(8/3); over the mean 4
    assert s.cv == pytest.approx(math.sqrt(8 / 3) / 4)
    assert s.tokens_per_s is None


def test_an_alternating_series_reports_its_mean_not_either_step():
    s = steady([3, 1, 3, 1, 3, 1], warmup=0)
    assert s.mean_s == pytest.approx(2.0)
    assert s.spread == pytest.approx(3.0)
    assert s.cv == pytest.approx(0.5)  # every step 1 from the mean 2
    assert s.median_s == pytest.approx(2.0)  # here the middle pair straddles; one step fewer and it is 1 or 3
    assert steady([3, 1, 3, 1, 3], warmup=0).median_s == 3.0
    assert steady([1, 3, 1, 3, 1], warmup=0).median_s == 1.0
    assert not s.even


def test_the_example_series_of_short_and_long_steps():
    secs = [7.2, 1.5, 8.5, 3.2, 6.2, 1.4]
    s = steady(secs, warmup=0)
    assert s.mean_s == pytest.approx(28.0 / 6)
    assert s.spread == pytest.approx(8.5 / 1.4)
    assert s.median_s == pytest.approx((3.2 + 6.2) / 2)


def test_tokens_per_second_is_the_steady_tokens_over_the_steady_seconds():
    s = steady([5.0, 2.0, 3.0, 9.0], tokens=[999, 100, 300, 7], warmup=1, tail=1)  # steps 2 and 3
    assert s.tokens_per_s == pytest.approx(400 / 5.0)
    assert steady([2.0, 2.0], tokens=[0, 0], warmup=0).tokens_per_s == 0.0


def test_even_is_the_spread_within_the_limit():
    assert SPREAD_LIMIT == 1.5
    assert steady([2.0, 3.0], warmup=0).even  # spread exactly 1.5
    assert not steady([2.0, 3.01], warmup=0).even
    assert steady([4.0], warmup=0).even and steady([4.0], warmup=0).cv == 0.0


def test_nothing_left_or_a_bad_step_gives_none():
    assert steady([]) is None
    assert steady([1.0]) is None  # the one step is the warm-up
    assert steady([1.0, 2.0], warmup=1, tail=1) is None
    assert steady([1.0, 2.0, 3.0], warmup=0, tail=5) is None
    assert steady([1.0, 2.0], warmup=9) is None
    assert steady([1.0, 0.0, 2.0], warmup=0) is None
    assert steady([1.0, -1.0], warmup=0) is None
    assert steady([1.0, float("nan")], warmup=0) is None
    assert steady([1.0, float("inf")], warmup=0) is None


def test_a_bad_step_outside_the_window_does_not_count():
    assert steady([0.0, 2.0, float("nan")], warmup=1, tail=1).mean_s == 2.0


def test_token_counts_of_another_length_raise():
    with pytest.raises(ValueError, match="2 token counts for 3 steps"):
        steady([1.0, 2.0, 3.0], tokens=[1, 2])
    with pytest.raises(ValueError):
        steady([1.0], tokens=[1, 2], warmup=1)  # raised even where no step is left


def test_ratio_is_of_the_means():
    a = steady([3, 1, 3, 1, 3, 1], warmup=0)  # mean 2
    b = steady([4.0, 4.0], warmup=0)  # mean 4
    assert ratio(a, b) == pytest.approx(0.5)
    assert ratio(b, a) == pytest.approx(2.0)
    assert ratio(a, None) is None and ratio(None, b) is None


def test_to_dict_rounds_and_says_even():
    d = steady([1.0, 2.0, 4.0], tokens=[1, 2, 4], warmup=0).to_dict()
    assert d["mean_s"] == round(7 / 3, 4) and d["spread"] == 4.0 and d["even"] is False
    assert d["steps"] == 3 and d["first"] == 0 and d["tokens_per_s"] == 1.0
    assert set(d) == set(Steady.__dataclass_fields__) | {"even"}


def test_the_clause_names_steps_that_alternate_and_not_noise_about_one_time():
    from rlgen.metrics.steady import uneven_clause

    noisy = [0.66, 0.64, 0.70, 0.65, 0.52, 0.68, 1.05, 0.67, 0.66, 0.69, 0.63]  # a checkpoint's slow step among them
    assert steady(noisy, warmup=0).spread > 1.5 and uneven_clause(steady(noisy, warmup=0), noisy) == ""
    alternating = [6.3, 10.2, 7.2, 10.4, 6.9, 10.3, 10.1, 6.5]  # one turn that does not flip
    assert "alternate between 6.3 s and 10.4 s" in uneven_clause(steady(alternating, warmup=0), alternating)
    ranging = [2.0, 2.5, 3.5, 5.0, 7.0, 9.0]
    assert "range from 2 s to 9 s" in uneven_clause(steady(ranging, warmup=0), ranging)
    assert uneven_clause(steady([1.0, 1.2, 1.1], warmup=0), [1.0, 1.2, 1.1]) == ""  # even
