"""Rollout correction (rlgen.algo.loss.rollout_keep, is_weight, corrected_loss): the two-sided band mask, outlier
rejection and the denominators, against the formulas written out here (docs/algorithms.md, section 4); the
conf/correction presets compose with every algo preset and pass the plan's checks; bad bands are refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from helpers import ALGO_NEEDS, clip_loss
from rlgen.config import LossAgg
from rlgen.config.compose import compose_run_config
from rlgen.plan import PlanError, build_plan

# trainer logprobs before the update = log w against an engine at 0, so each token's IS weight is w; pi_old is the
# trainer's (old_logprobs=trainer) and logp = pi_old, so the ratio is 1, nothing clips, and each token's
# surrogate is A times its weight w
W = [[3.0, 1.0, 0.4, 1.5], [1.2, 0.8, 1.0, 1.0]]
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
A = torch.tensor([1.0, -1.0])


def _loss(agg: LossAgg, **settings):
    old = torch.log(torch.tensor(W))
    return clip_loss(old.clone().requires_grad_(), torch.zeros(2, 4), A, MASK, agg=agg, old_logp=old,
                     max_new_tokens=4, **settings)


BAND = {"tis_mode": "mask", "tis_low": 0.5, "tis_cap": 2.0}


def test_a_two_sided_band_drops_tokens_from_numerator_and_denominator():
    # kept: row 0 the tokens of w 1 and 1.5 (3 > 2 and 0.4 < 0.5 leave), row 1 all three (w 1.2, 0.8, 1)
    row0, row1 = (1.0 + 1.5) * 1.0, (1.2 + 0.8 + 1.0) * -1.0
    loss, metrics = _loss(LossAgg.token_mean, **BAND)
    assert loss.item() == pytest.approx(-(row0 + row1) / 5)  # 5 kept tokens, not 7
    assert metrics["tis_frac"] == pytest.approx(2 / 7) and metrics["seq_masked_frac"] == 0.0
    loss, _ = _loss(LossAgg.seq_mean_token_mean, **BAND)
    assert loss.item() == pytest.approx(-(row0 / 2 + row1 / 3) / 2)  # each row over its kept tokens
    loss, _ = _loss(LossAgg.seq_mean_token_sum_norm, **BAND)
    assert loss.item() == pytest.approx(-(row0 + row1) / 4 / 2)  # Dr. GRPO's constant N x max_new_tokens
    one_sided, _ = _loss(LossAgg.token_mean, **{**BAND, "tis_low": 0.0})  # 0.4 stays in
    assert one_sided.item() == pytest.approx(-(row0 + 0.4 + row1) / 6)


def test_a_two_sided_band_on_the_engines_ratio():
    # old_logprobs=engine: the ratio carries w, so a kept token's surrogate is min(w A, clip(w) A) and no weight
    logp = torch.log(torch.tensor(W)).requires_grad_()
    loss, _ = clip_loss(logp, torch.zeros(2, 4), A, MASK, agg=LossAgg.token_mean, max_new_tokens=4, **BAND)
    kept = [(1.0, 1.0), (1.5, 1.0), (1.2, -1.0), (0.8, -1.0), (1.0, -1.0)]  # (w, A)
    want = sum(min(w * a, min(max(w, 0.8), 1.2) * a) for w, a in kept) / 5
    assert loss.item() == pytest.approx(-want)
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 2] == 0  # the dropped tokens have no gradient


def test_outlier_rejection_drops_the_whole_sequence():
    # row 0 has tokens outside [0.5, 2]: all four leave, whichever mode; row 1 trains (its w, all inside)
    for mode in ("mask", "truncate"):
        loss, metrics = _loss(LossAgg.token_mean, **{**BAND, "tis_mode": mode, "tis_seq_reject": True})
        assert loss.item() == pytest.approx(-(1.2 + 0.8 + 1.0) * -1.0 / 3)
        assert metrics["seq_masked_frac"] == pytest.approx(1 / 2)


def test_sequence_level_band_masks_by_the_geometric_mean():
    # row 0: exp(mean log w) = (3 * 1 * 0.4 * 1.5) ** (1/4) = 1.8 ** 0.25 ~ 1.158, inside; row 1 also: nothing drops
    loss, metrics = _loss(LossAgg.token_mean, **BAND, tis_level="sequence")
    g0, g1 = 1.8 ** 0.25, math.exp((math.log(1.2) + math.log(0.8)) / 3)
    assert loss.item() == pytest.approx(-(4 * g0 - 3 * g1) / 7, rel=1e-5)
    assert metrics["tis_frac"] == 0.0
    tight, _ = _loss(LossAgg.token_mean, **{**BAND, "tis_cap": 1.1}, tis_level="sequence")  # row 0 leaves whole
    assert tight.item() == pytest.approx(3 * g1 / 3, rel=1e-5)


PRESETS = sorted(p.stem for p in (Path(__file__).parents[2] / "src/rlgen/conf/correction").glob("*.yaml"))
ALGOS = sorted(p.stem for p in (Path(__file__).parents[2] / "src/rlgen/conf/algo").glob("*.yaml")
               if not p.stem.startswith("base"))


def test_the_presets_are_the_documented_ones():
    assert PRESETS == ["icepop", "mis", "off", "seq_reject", "tis"]
    a = compose_run_config(["correction=icepop"]).algo
    assert (a.tis_mode, a.tis_low, a.tis_cap, a.tis_seq_reject) == ("mask", 0.5, 5.0, False)
    docs = (Path(__file__).parents[2] / "docs/algorithms.md").read_text()
    assert all(f"| `{p}` |" in docs for p in PRESETS)


@pytest.mark.parametrize("algo", ALGOS)
def test_every_preset_composes_over_every_algo_and_plans(algo):
    for preset in PRESETS:
        cfg = compose_run_config([f"algo={algo}", f"correction={preset}", *ALGO_NEEDS.get(algo, [])])
        assert cfg.algo.kind == algo
        build_plan(cfg)  # the plan's checks pass


@pytest.mark.parametrize(("overrides", "words"), [
    (["algo.tis_low=1.5", "algo.tis_mode=mask"], "algo.tis_low=1.5 must be in [0, 1)"),
    (["algo.tis_low=0.5"], "read only by algo.tis_mode=mask"),
    (["algo.tis_seq_reject=true", "algo.tis_cap=0"], "need the band's upper end, algo.tis_cap > 0"),
])
def test_a_band_that_cannot_work_is_refused(overrides, words):
    with pytest.raises(PlanError) as err:
        build_plan(compose_run_config(overrides))
    assert any(words in p for p in err.value.problems)


def test_the_ranks_tis_frac_merges_over_their_response_tokens():
    from rlgen.learners.group import merge_rank_metrics
    from rlgen.metrics.reduce import value_and_how

    # rank 0 dropped 5 of its 10 tokens (5 left in the loss), rank 1 none of its 30: 5 of 40 outside the band
    a = {"tis_frac": 0.5, "response_tokens": 10, "loss_tokens": 5}
    b = {"tis_frac": 0.0, "response_tokens": 30, "loss_tokens": 30}
    how = {"tis_frac": value_and_how(0.5)[1]}  # the loss reports it as a plain number: a mean over response tokens
    assert merge_rank_metrics([a, b], how)["tis_frac"] == pytest.approx(5 / 40)
