import math

import pytest
import torch

from helpers import clip_loss
from rlgen.algo.advantages import group_advantages
from rlgen.algo.loss import (
    aggregate,
    kl_k3,
    normaliser,
    sequence_keep,
    token_logprobs,
)
from rlgen.config import LossAgg

LOSS_KW = dict(clip_low=0.2, clip_high=0.2, tis_cap=0.0, seq_mask_cap=0.0, max_new_tokens=4)


# -- group_advantages ----------------------------------------------------------------------------------------

# group 3: [1, 0, 0, 0] -> mean 0.25, centred [0.75, -0.25, -0.25, -0.25], population std sqrt(0.1875)
# group 9: [2, 4] -> mean 3, centred [-1, 1], population std 1
# group 5: [0.3, 0.3, 0.3] -> constant, 0
REWARDS = torch.tensor([1.0, 2.0, 0.0, 0.3, 0.0, 4.0, 0.0, 0.3, 0.3])
GROUPS = torch.tensor([3, 9, 3, 5, 3, 9, 3, 5, 5])


def test_group_advantages_centred_only():
    adv = group_advantages(REWARDS, GROUPS, scale="none")
    want = torch.tensor([0.75, -1.0, -0.25, 0.0, -0.25, 1.0, -0.25, 0.0, 0.0])
    torch.testing.assert_close(adv, want)


def test_group_advantages_std_normalised_uses_population_std():
    adv = group_advantages(REWARDS, GROUPS, eps=1e-6)
    s3 = math.sqrt(0.1875)  # population std; the unbiased one (0.5) would give 1.5 for the first entry
    want = torch.tensor(
        [0.75 / (s3 + 1e-6), -1 / (1 + 1e-6), -0.25 / (s3 + 1e-6), 0.0]
        + [-0.25 / (s3 + 1e-6), 1 / (1 + 1e-6), -0.25 / (s3 + 1e-6), 0.0, 0.0]
    )
    torch.testing.assert_close(adv, want)
    assert adv[0].item() == pytest.approx(math.sqrt(3), rel=1e-5)


def test_group_advantages_constant_groups_are_exactly_zero():
    adv = group_advantages(torch.tensor([0.1, 0.1, 0.1, 7.0]), torch.tensor([0, 0, 0, 1]), scale="group")
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


# -- token_logprobs ------------------------------------------------------------------------------------------


def test_token_logprobs_matches_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11) * 4  # [N, T, V]
    targets = torch.randint(0, 11, (3, 5))  # [N, T]
    want = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    got = token_logprobs(logits, targets)
    torch.testing.assert_close(got, want)
    assert got.dtype == torch.float32


def test_token_logprobs_upcasts_low_precision_and_backpropagates():
    torch.manual_seed(1)
    logits = (torch.randn(2, 4, 7) * 3).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 7, (2, 4))
    got = token_logprobs(logits, targets)
    want = torch.log_softmax(logits.detach().float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)
    got.sum().backward()
    # d/dlogits sum_t logp = onehot - softmax; each row of the gradient sums to 0
    assert logits.grad.float().sum(-1).abs().max().item() < 1e-2


# -- aggregate -----------------------------------------------------------------------------------------------

VALUES = torch.tensor([[1.0, 2.0, math.inf], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])  # inf sits under a 0
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("agg", "want", "den"),
    [
        (LossAgg.token_mean, 7 / 3, 3.0),  # (1 + 2 + 4) / 3 tokens
        (LossAgg.seq_mean_token_mean, 2.75, 2.0),  # (1.5 + 4) / 2 sequences with tokens
        (LossAgg.seq_mean_token_sum_norm, (3 / 4 + 4 / 4 + 0) / 3, 3.0),  # sums / max_new_tokens=4, over N=3
    ],
)
def test_aggregate_hand_values(agg, want, den):
    assert aggregate(VALUES, MASK, agg, max_new_tokens=4).item() == pytest.approx(want)
    assert normaliser(MASK, agg, max_new_tokens=4) == den
    undivided = aggregate(VALUES, MASK, agg, max_new_tokens=4, denominator=1.0).item()
    assert undivided == pytest.approx(want * den)


@pytest.mark.parametrize("agg", list(LossAgg))
def test_aggregate_of_empty_mask_is_zero(agg):
    assert aggregate(VALUES, torch.zeros(3, 3), agg, max_new_tokens=4).item() == 0.0


# -- ppo_clip_loss -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agg", "norm"),
    [
        # mask rows have 3 and 2 tokens; N = 2; max_new_tokens = 4
        (LossAgg.token_mean, torch.tensor([[5.0], [5.0]])),
        (LossAgg.seq_mean_token_mean, torch.tensor([[3.0 * 2], [2.0 * 2]])),
        (LossAgg.seq_mean_token_sum_norm, torch.tensor([[4.0 * 2], [4.0 * 2]])),
    ],
)
def test_on_policy_loss_is_minus_mean_advantage(agg, norm):
    torch.manual_seed(0)
    engine = -torch.rand(2, 3) * 3  # [N, L]
    logp = engine.clone().requires_grad_()
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, metrics = clip_loss(logp, engine, adv, mask, agg=agg, **LOSS_KW)
    want = -aggregate(adv.unsqueeze(-1).expand(2, 3), mask, agg, max_new_tokens=4)
    assert loss.item() == pytest.approx(want.item())
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv.unsqueeze(-1) * mask / norm)
    assert metrics["clip_frac"] == 0.0 and metrics["tis_frac"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["ratio_max"] == pytest.approx(1.0)


def test_clipped_token_has_no_gradient_and_is_counted():
    engine = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    logp = (engine + torch.tensor([[math.log(1.5), 0.0], [math.log(1.5), 0.0]])).requires_grad_()
    adv = torch.tensor([1.0, -1.0])
    loss, metrics = clip_loss(logp, engine, adv, torch.ones(2, 2), agg=LossAgg.token_mean, **LOSS_KW)
    # row 0 (A=+1): s = [min(1.5, 1.2), 1] = [1.2, 1]; row 1 (A=-1): s = [min(-1.5, -1.2), -1] = [-1.5, -1]
    assert loss.item() == pytest.approx(-(1.2 + 1.0 - 1.5 - 1.0) / 4)
    loss.backward()
    # only row 0's first token is on the clipped branch: zero gradient; row 1's is unclipped: -rho*A/4
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.25], [1.5 / 4, 0.25]]))
    assert metrics["clip_frac"] == pytest.approx(1 / 4)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 1 + 1.5 + 1) / 4)


def test_truncated_is_caps_value_and_gradient():
    engine = torch.tensor([[-2.0, -2.0]])
    logp = (engine + torch.tensor([[math.log(5.0), 0.0]])).requires_grad_()
    adv = torch.tensor([-1.0])
    kw = {**LOSS_KW, "tis_cap": 2.0}
    loss, metrics = clip_loss(logp, engine, adv, torch.ones(1, 2), agg=LossAgg.token_mean, **kw)
    # token 0: rho = 5, unclipped branch (A < 0), truncated to value C*A = -2; token 1: -1. Normaliser 2.
    assert loss.item() == pytest.approx(-(2 * -1.0 + -1.0) / 2)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[2 * -1.0 * -1 / 2, 1.0 / 2]]))
    assert metrics["tis_frac"] == pytest.approx(0.5)

    # without the cap the same token carries the full weight rho*A
    logp.grad = None
    loss, metrics = clip_loss(logp, engine, adv, torch.ones(1, 2), agg=LossAgg.token_mean, **LOSS_KW)
    assert loss.item() == pytest.approx(-(5 * -1.0 + -1.0) / 2)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[5 / 2, 1 / 2]]))
    assert metrics["tis_frac"] == 0.0


def test_truncated_is_on_a_clipped_token_keeps_zero_gradient():
    engine = torch.tensor([[-2.0]])
    logp = (engine + math.log(5.0)).requires_grad_()
    kw = {**LOSS_KW, "tis_cap": 2.0}
    loss, _ = clip_loss(logp, engine, torch.tensor([1.0]), torch.ones(1, 1), agg=LossAgg.token_mean, **kw)
    assert loss.item() == pytest.approx(-1.2 * 2 / 5)  # clipped value (1 + clip_high) * A, scaled by C / rho
    loss.backward()
    assert logp.grad.item() == 0.0


def test_sequence_mask_drops_drifted_sequence():
    engine = torch.full((3, 2), -1.0)
    drift = torch.tensor([[0.0, 0.0], [0.5, -0.5], [1.0, -1.0]])  # mean |drift|: 0, 0.5, 1.0
    logp = (engine + drift).requires_grad_()
    adv = torch.tensor([1.0, 1.0, 1.0])
    kw = {**LOSS_KW, "seq_mask_cap": 2.0}  # log 2 = 0.693: row 2 goes, row 1 stays
    assert sequence_keep(logp, engine, torch.ones(3, 2), 2.0).tolist() == [True, True, False]
    loss, metrics = clip_loss(logp, engine, adv, torch.ones(3, 2), agg=LossAgg.token_mean, **kw)
    rho = [1.0, 1.0, math.exp(0.5), math.exp(-0.5)]
    s = [min(r, 1.2) for r in rho]  # A = 1: min(rho, clip(rho, 0.8, 1.2)) = min(rho, 1.2)
    assert loss.item() == pytest.approx(-sum(s) / 4)
    loss.backward()
    assert logp.grad[2].tolist() == [0.0, 0.0]
    assert metrics["seq_masked_frac"] == pytest.approx(1 / 3)
    # with masking off all three rows count
    loss_all, m_all = clip_loss(logp, engine, adv, torch.ones(3, 2), agg=LossAgg.token_mean, **LOSS_KW)
    assert m_all["seq_masked_frac"] == 0.0
    assert loss_all.item() != pytest.approx(loss.item())


def test_non_finite_logp_is_not_masked_away():
    engine = torch.zeros(2, 2)
    logp = torch.tensor([[0.0, math.nan], [0.0, 0.0]])
    kw = {**LOSS_KW, "seq_mask_cap": 2.0, "tis_cap": 2.0}
    loss, metrics = clip_loss(logp, engine, torch.ones(2), torch.ones(2, 2), agg=LossAgg.token_mean, **kw)
    assert math.isnan(loss.item())
    assert math.isnan(metrics["ratio_max"])


def test_values_under_a_zero_mask_never_leak():
    engine = torch.tensor([[-1.0, 0.0]])
    logp = torch.tensor([[-1.0, math.inf]], requires_grad=True)
    loss, _ = clip_loss(
        logp, engine, torch.tensor([2.0]), torch.tensor([[1.0, 0.0]]), agg=LossAgg.token_mean, **LOSS_KW
    )
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    assert logp.grad.tolist() == [[-2.0, 0.0]]


# -- kl_k3 ---------------------------------------------------------------------------------------------------


def test_kl_k3_hand_values_and_sign():
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.0, -1.0, -1.5]])  # d = ref - logp = [0, 1, -1]
    want = torch.tensor([[0.0, math.e - 2.0, math.exp(-1.0)]])
    torch.testing.assert_close(kl_k3(logp, ref), want)
    torch.manual_seed(0)
    a, b = torch.randn(50, 7) * 3, torch.randn(50, 7) * 3
    assert kl_k3(a, b).min().item() >= 0.0
    assert kl_k3(a, a).abs().max().item() == 0.0
