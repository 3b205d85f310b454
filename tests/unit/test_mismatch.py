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


def _long_rows():
    """Three rows of 600, 3,000 and 40,000 response tokens (the second with a hole, as an episode's), each with
    its own constant delta: 0.1, 0.2, 0.3."""
    lengths, deltas = (600, 3000, 40000), (0.1, 0.2, 0.3)
    mask = torch.zeros(3, 40000)
    trainer = torch.zeros(3, 40000)
    for i, (n, d) in enumerate(zip(lengths, deltas)):
        mask[i, :n] = 1.0
        trainer[i, :n] = -d
    mask[1, 10:20] = 0.0
    return trainer, torch.zeros(3, 40000), mask


def test_mismatch_is_kept_by_response_length():
    from rlgen.metrics.mismatch import mismatch_by_length, response_lengths

    trainer, engine, mask = _long_rows()
    assert response_lengths(mask).tolist() == [600, 3000, 40000]
    got = mismatch_by_length(trainer, engine, mask, threshold=1.0)
    assert set(got) == {f"by_length/{b}/{k}" for b in ("0-1k", "1k-8k", "32k+")
                        for k in ("k3_kl", "mean_abs_delta", "max_abs_delta", "tokens")}  # no row of 8k-32k
    assert got["by_length/0-1k/tokens"] == 600 and got["by_length/1k-8k/tokens"] == 2990
    for bucket, d in (("0-1k", 0.1), ("1k-8k", 0.2), ("32k+", 0.3)):
        assert got[f"by_length/{bucket}/mean_abs_delta"] == pytest.approx(d)
        assert got[f"by_length/{bucket}/k3_kl"] == pytest.approx(math.exp(-d) + d - 1)


def test_the_ranks_mismatch_by_length_merges_by_tokens():
    from rlgen.learners.group import merge_rank_metrics

    a = {"loss": 1.0, "mismatch/by_length/0-1k/tokens": 100, "mismatch/by_length/0-1k/k3_kl": 0.01,
         "mismatch/by_length/0-1k/mean_abs_delta": 0.1, "mismatch/by_length/0-1k/max_abs_delta": 0.5}
    b = {"loss": 2.0, "mismatch/by_length/0-1k/tokens": 300, "mismatch/by_length/0-1k/k3_kl": 0.03,
         "mismatch/by_length/0-1k/mean_abs_delta": 0.3, "mismatch/by_length/0-1k/max_abs_delta": 0.4,
         "mismatch/by_length/32k+/tokens": 50000, "mismatch/by_length/32k+/k3_kl": 0.002,
         "mismatch/by_length/32k+/mean_abs_delta": 0.05, "mismatch/by_length/32k+/max_abs_delta": float("nan")}
    m = merge_rank_metrics([a, b], {})  # the buckets merge by their own rules, whatever the ranks declared
    assert m["mismatch/by_length/0-1k/tokens"] == 400
    assert m["mismatch/by_length/0-1k/k3_kl"] == pytest.approx(0.025)
    assert m["mismatch/by_length/0-1k/mean_abs_delta"] == pytest.approx(0.25)
    assert m["mismatch/by_length/0-1k/max_abs_delta"] == 0.5
    assert m["mismatch/by_length/32k+/tokens"] == 50000 and m["mismatch/by_length/32k+/k3_kl"] == 0.002
    assert math.isnan(m["mismatch/by_length/32k+/max_abs_delta"])  # a non-finite delta stays visible
