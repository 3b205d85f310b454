import math

import pytest
import torch

from rlgen.metrics.mismatch import mismatch_metrics

# masked r = trainer - engine = [0, -0.5, 1.0, -1.0]; the unmasked (1, 1) entry differs by 5 and must not count
TRAINER = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, 0.0, 0.0]])
ENGINE = torch.tensor([[-1.0, -1.5, -1.5], [-2.0, -5.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_hand_values():
    m = mismatch_metrics(TRAINER, ENGINE, MASK, threshold=0.75)
    k3 = [0.0, math.exp(-0.5) + 0.5 - 1, math.e - 2, math.exp(-1.0)]  # exp(r) - r - 1
    assert m["k3_kl"] == pytest.approx(sum(k3) / 4)
    assert m["k3_kl"] == pytest.approx(0.29817298, abs=1e-7)
    assert m["mean_abs_delta"] == pytest.approx(0.625)
    assert m["max_abs_delta"] == pytest.approx(1.0)
    assert m["frac_over_threshold"] == pytest.approx(0.5)  # |r| in {1.0, 1.0} exceed 0.75
    assert m["tokens"] == 4
    assert mismatch_metrics(TRAINER, ENGINE, MASK, threshold=1.0)["frac_over_threshold"] == 0.0  # strict


def test_identical_logprobs_give_zero():
    m = mismatch_metrics(TRAINER, TRAINER.clone(), MASK, threshold=0.1)
    assert m == {
        "k3_kl": 0.0,
        "mean_abs_delta": 0.0,
        "max_abs_delta": 0.0,
        "frac_over_threshold": 0.0,
        "tokens": 4,
    }


def test_no_masked_tokens():
    m = mismatch_metrics(TRAINER, ENGINE, torch.zeros(2, 3), threshold=0.5)
    assert m == {
        "k3_kl": 0.0,
        "mean_abs_delta": 0.0,
        "max_abs_delta": 0.0,
        "frac_over_threshold": 0.0,
        "tokens": 0,
    }


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_masked_delta_is_visible(bad):
    trainer = TRAINER.clone()
    trainer[0, 1] = bad
    m = mismatch_metrics(trainer, ENGINE, MASK, threshold=0.75)
    assert not math.isfinite(m["max_abs_delta"])
    assert not math.isfinite(m["mean_abs_delta"])
    assert not math.isfinite(m["k3_kl"])
    assert m["frac_over_threshold"] == pytest.approx(3 / 4)  # the bad token counts as over
    assert m["tokens"] == 4


def test_non_finite_engine_value_is_visible_too():
    engine = ENGINE.clone()
    engine[1, 0] = math.nan
    assert math.isnan(mismatch_metrics(TRAINER, engine, MASK, threshold=0.75)["max_abs_delta"])


def test_non_finite_under_a_zero_mask_is_ignored():
    trainer = TRAINER.clone()
    trainer[1, 2] = math.nan
    m = mismatch_metrics(trainer, ENGINE, MASK, threshold=0.75)
    assert m["max_abs_delta"] == pytest.approx(1.0)
