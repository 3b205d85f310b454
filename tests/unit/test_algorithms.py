"""Each loss and advantage variant on small hand-computed examples, values and gradients, written from the papers'
equations (docs/algorithms.md). Expected numbers come from plain `math`, never from the code under test."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from helpers import clip_loss
from rlgen.algo.advantages import group_advantages, informative_groups, overlong_penalty
from rlgen.algo.loss import (
    AdvantageShapeError,
    is_weight,
    kl_estimate,
    token_entropy,
    top_entropy_mask,
)
from rlgen.algo.registry import configured_loss
from rlgen.config import AlgoConfig, ISMode, KLEstimator, Level, LossAgg
from rlgen.learners.grpo_step import StepSums, micro_loss, token_kl
from rlgen.learners.packed import pack
from rlgen.learners.token_batch import Micro
from rlgen.metrics.reduce import MAX, Reduced

EPS = 1e-6
NO_IS = dict(clip_low=0.2, clip_high=0.2, tis_cap=0.0, seq_mask_cap=0.0, max_new_tokens=4)


def close(got: torch.Tensor, want: list) -> None:
    torch.testing.assert_close(got.detach(), torch.tensor(want, dtype=got.dtype), rtol=1e-5, atol=1e-6)


# -- advantages ----------------------------------------------------------------------------------------------

# group 0: [1, 0, 0, 0] -> mean 0.25, centred [0.75, -0.25, -0.25, -0.25], sum of squares 0.75
# group 1: [2, 4]       -> mean 3,    centred [-1, 1],                    sum of squares 2
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1])
CENTRED = [0.75, -0.25, -0.25, -0.25, -1.0, 1.0]


def test_group_scale_unbiased_std():
    # GRPO with TRL's std: A_i = (r_i - mean_g) / (sqrt(sum (r - mean_g)^2 / (n_g - 1)) + eps)
    adv = group_advantages(REWARDS, GROUPS, scale="group", std="unbiased", eps=EPS)
    s0, s1 = math.sqrt(0.75 / 3), math.sqrt(2 / 1)  # 0.5 and sqrt(2); population would be sqrt(0.1875) and 1
    close(adv, [c / (s0 + EPS) for c in CENTRED[:4]] + [c / (s1 + EPS) for c in CENTRED[4:]])


@pytest.mark.parametrize(("std", "den"), [("population", 6), ("unbiased", 5)])
def test_batch_scale_divides_by_the_std_of_all_rewards(std, den):
    # batch scaling: A_i = (r_i - mean_g) / (std of every reward of the batch + eps), std over n or n - 1
    batch_mean = 7 / 6
    ss = sum((r - batch_mean) ** 2 for r in [1, 0, 0, 0, 2, 4])
    s = math.sqrt(ss / den)
    adv = group_advantages(REWARDS, GROUPS, scale="batch", std=std, eps=EPS)
    close(adv, [c / (s + EPS) for c in CENTRED])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_nan_reward_gets_zero_and_leaves_mean_and_std(scale):
    # a NaN reward takes no part in any mean/std and gets A = 0; a group of equal finite rewards gets 0
    rewards = torch.tensor([1.0, math.nan, 0.0, 3.0, 5.0, math.nan, 2.0, 2.0])
    groups = torch.tensor([7, 7, 7, 7, 8, 8, 9, 9])
    adv = group_advantages(rewards, groups, scale=scale, std="population", eps=EPS)
    # group 7's finite rewards [1, 0, 3]: mean 4/3 (not 1, as NaN-as-0 would give)
    centred = [1 - 4 / 3, 0 - 4 / 3, 3 - 4 / 3]
    if scale == "group":
        div = math.sqrt(sum(c * c for c in centred) / 3) + EPS  # sqrt(14)/3, over the 3 finite rewards
    elif scale == "batch":
        finite = [1, 0, 3, 5, 2, 2]
        mu = sum(finite) / 6
        div = math.sqrt(sum((r - mu) ** 2 for r in finite) / 6) + EPS
    else:
        div = 1.0
    want = [centred[0] / div, 0.0, centred[1] / div, centred[2] / div, 0.0, 0.0, 0.0, 0.0]
    close(adv, want)
    # group 8 has one finite reward and group 9 two equal ones: exactly 0, as is the NaN itself
    assert adv[1].item() == 0.0 and adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_overlong_penalty_is_dapo_soft_punishment():
    # DAPO: R = 0 if |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache if below L_max; -1 beyond (x penalty)
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    got = overlong_penalty(lengths, max_new_tokens=10, buffer=4, penalty=0.5)
    close(got, [0.0, 0.0, -0.5 * 1 / 4, -0.5 * 2 / 4, -0.5, -0.5])
    assert overlong_penalty(lengths, max_new_tokens=10, buffer=0, penalty=0.5).tolist() == [0.0] * 6


def test_informative_groups_need_two_different_finite_rewards():
    # DAPO dynamic sampling keeps a group only if 0 < #correct < G, i.e. its rewards are not all equal
    rewards = torch.tensor([1.0, 1.0, 0.0, 2.0, 2.0, math.nan, 3.0, 3.0, math.nan, 1.0, 2.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3])
    want = [True] * 3 + [False] * 2 + [False] * 3 + [True] * 3
    assert informative_groups(rewards, groups).tolist() == want


# -- GSPO: the sequence-level ratio --------------------------------------------------------------------------


def test_gspo_sequence_ratio_value_gradient_and_padding():
    # GSPO: s_i = exp(mean_t(logp - engine)); J = (1/N) sum_i min(s_i A_i, clip(s_i, 1-eps_l, 1+eps_h) A_i)
    engine = torch.full((4, 3), -1.0)
    delta = torch.tensor([[0.1, -0.05, 0.25],  # mean 0.1, A=+1: unclipped
                          [0.3, 0.1, 4.0],  # mean 0.2 over 2 tokens (the 4.0 is padding), A=-2: unclipped
                          [0.5, 0.5, 0.5],  # s = e^0.5 > 1.3, A=+1: clipped at 1.3
                          [-0.4, -0.6, 2.0]])  # mean -0.5, s = e^-0.5 < 0.8, A=-1: clipped at 0.8
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    logp = (engine + delta).requires_grad_()
    adv = torch.tensor([1.0, -2.0, 1.0, -1.0])
    loss, metrics = clip_loss(logp, engine, adv, mask, clip_low=0.2, clip_high=0.3, tis_cap=0.0, seq_mask_cap=0.0,
                                agg=LossAgg.seq_mean_token_mean, max_new_tokens=3, importance_level=Level.sequence)
    s0, s1, s2, s3 = math.exp(0.1), math.exp(0.2), math.exp(0.5), math.exp(-0.5)
    assert loss.item() == pytest.approx(-(s0 * 1 + s1 * -2 + 1.3 * 1 + 0.8 * -1) / 4, rel=1e-6)
    loss.backward()
    # d loss / d logp_{i,t} = -(1/N) A_i s_i / |y_i| on the unclipped branch; 0 where the clip binds or t is padding
    g0, g1 = -(1 / 4) * 1 * s0 / 3, -(1 / 4) * -2 * s1 / 2
    close(logp.grad, [[g0, g0, g0], [g1, g1, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert metrics["clip_frac"] == pytest.approx(5 / 10)
    assert metrics["ratio_max"] == pytest.approx(s2, rel=1e-6)
    assert metrics["ratio_mean"] == pytest.approx((3 * s0 + 2 * s1 + 3 * s2 + 2 * s3) / 10, rel=1e-6)


# -- engine/trainer importance-sampling correction -----------------------------------------------------------


def test_is_weight_token_and_sequence_levels():
    # w_t = rho_t (token) or exp(mean_t log rho_t) (sequence); truncate: min(1, C / w); mask: 0 where w > C
    engine = torch.zeros(2, 3)
    logp = torch.tensor([[math.log(9.0), 0.0, 5.0], [math.log(1.5), math.log(0.5), 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)  # row 0's 5.0 is padding
    w, over = is_weight(logp, engine, mask, 2.0, Level.token, ISMode.truncate)
    close(w, [[2 / 9, 1, 1], [1, 1, 1]])
    assert over.tolist() == [[True, False, False], [False, False, False]]
    w, out = is_weight(logp, engine, mask, 2.0, Level.token, ISMode.mask)  # mask: out of the loss's mask instead
    close(w, [[1, 1, 1], [1, 1, 1]])
    assert out.tolist() == [[True, False, False], [False, False, False]]
    # sequence: row 0 w = exp((log 9 + 0) / 2) = 3 (the padding does not count); row 1 w = 0.75^(1/3) < 2
    w, over = is_weight(logp, engine, mask, 2.0, Level.sequence, ISMode.truncate)
    close(w, [[2 / 3, 2 / 3, 1], [1, 1, 1]])
    assert over.tolist() == [[True, True, False], [False, False, False]]
    w, out = is_weight(logp, engine, mask, 2.0, "sequence", "mask")
    close(w, [[1, 1, 1], [1, 1, 1]])
    assert out.tolist() == [[True, True, False], [False, False, False]]
    assert is_weight(logp, engine, mask, 0.0, Level.sequence, ISMode.mask)[0].tolist() == [[1.0] * 3] * 2


@pytest.mark.parametrize(
    ("level", "mode", "w0", "tis_frac", "d"),
    [
        (Level.token, ISMode.truncate, (2 / 9, 1.0), 1 / 5, 5),  # rho = 9 > C: weight C / rho
        (Level.token, ISMode.mask, (0.0, 1.0), 1 / 5, 4),  # the masked token leaves the denominator too
        (Level.sequence, ISMode.truncate, (2 / 3, 2 / 3), 2 / 5, 5),  # sequence w = 3 > C on both tokens
        (Level.sequence, ISMode.mask, (0.0, 0.0), 2 / 5, 3),
    ],
)
def test_policy_loss_with_is_correction(level, mode, w0, tis_frac, d):
    # token_mean of v_t = is_weight_t * min(rho_t A, clip(rho_t) A) over the d tokens the loss keeps, weight a
    # stop-gradient constant
    engine = torch.zeros(2, 3)
    logp = torch.tensor([[math.log(9.0), 0.0, 5.0], [math.log(1.5), math.log(0.5), 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([-1.0, 1.0])
    loss, metrics = clip_loss(logp, engine, adv, mask, clip_low=0.2, clip_high=0.2, tis_cap=2.0, seq_mask_cap=0.0,
                                agg=LossAgg.token_mean, max_new_tokens=3, tis_level=level, tis_mode=mode)
    # row 0 (A=-1): rho [9, 1] unclipped -> [-9, -1]; row 1 (A=+1): rho [1.5, 0.5, 1] -> [1.2 (clipped), 0.5, 1]
    assert loss.item() == pytest.approx(-(w0[0] * -9 + w0[1] * -1 + 1.2 + 0.5 + 1.0) / d, rel=1e-6)
    loss.backward()
    # d v / d logp = weight * rho * A on the unclipped branch
    close(logp.grad, [[w0[0] * 9 / d, w0[1] / d, 0.0], [0.0, -0.5 / d, -1 / d]])
    assert metrics["tis_frac"] == pytest.approx(tis_frac)


# -- KL estimators -------------------------------------------------------------------------------------------

LOGP = [-1.0, -2.0, -0.5]
REF = [-1.5, -1.0, -0.5]  # d = logp - ref = [0.5, -1, 0]
ENGINE = [-1.2, -2.0, -0.1]  # logp - engine = [0.2, 0, -0.4]
KL = {  # Schulman's estimators of KL(pi || ref) on pi's samples: (value, d value / d logp) as functions of d
    KLEstimator.k1: (lambda d: d, lambda d: 1.0),
    KLEstimator.k2: (lambda d: d * d / 2, lambda d: d),
    KLEstimator.k3: (lambda d: math.exp(-d) + d - 1, lambda d: 1 - math.exp(-d)),
}


@pytest.mark.parametrize("est", list(KLEstimator))
def test_kl_estimate_values_and_gradients(est):
    # k1 = d, k2 = d^2 / 2, k3 = exp(-d) + d - 1, d = logp - ref; gradients 1, d, 1 - exp(-d)
    logp = torch.tensor([LOGP], requires_grad=True)
    kl = kl_estimate(logp, torch.tensor([REF]), est)
    f, df = KL[est]
    ds = [a - b for a, b in zip(LOGP, REF)]
    close(kl, [[f(d) for d in ds]])
    kl.sum().backward()
    close(logp.grad, [[df(d) for d in ds]])


@pytest.mark.parametrize("est", list(KLEstimator))
def test_token_kl_bias_correction_weighs_by_ratio(est):
    # corrected KL_t = k(d_t) * rho_t, rho_t = exp(logp_t - engine_t); gradient k'(d) rho + k(d) rho (product rule)
    logp = torch.tensor([LOGP], requires_grad=True)
    ref, engine = torch.tensor([REF]), torch.tensor([ENGINE])
    f, df = KL[est]
    ds = [a - b for a, b in zip(LOGP, REF)]
    rho = [math.exp(a - b) for a, b in zip(LOGP, ENGINE)]
    kl = token_kl(logp, engine, ref, AlgoConfig(kl_estimator=est, kl_bias_correction=True))
    close(kl, [[f(d) * r for d, r in zip(ds, rho)]])
    kl.sum().backward()
    close(logp.grad, [[(df(d) + f(d)) * r for d, r in zip(ds, rho)]])
    plain = token_kl(logp, engine, ref, AlgoConfig(kl_estimator=est, kl_bias_correction=False))
    close(plain, [[f(d) for d in ds]])


# -- entropy -------------------------------------------------------------------------------------------------


def test_token_entropy_matches_minus_sum_p_log_p():
    # H = -sum_v p_v log p_v, p = softmax(logits)
    logits = torch.tensor([[[0.0, 0.0, 0.0], [0.0, math.log(2.0), math.log(3.0)], [10.0, 0.0, 0.0]]])
    z = math.exp(10) + 2
    dists = [[1 / 3] * 3, [1 / 6, 2 / 6, 3 / 6], [math.exp(10) / z, 1 / z, 1 / z]]
    close(token_entropy(logits), [[-sum(p * math.log(p) for p in ps) for ps in dists]])
    assert token_entropy(logits)[0, 0].item() == pytest.approx(math.log(3))


@pytest.mark.parametrize("a", [1.0, -0.5, 0.0, 3.0])
def test_token_entropy_gradient_for_two_tokens(a):
    # logits [a, 0]: p = sigmoid(a), H = -p log p - (1-p) log(1-p), dH/da = -a p (1 - p): pushes toward uniform
    logits = torch.tensor([[[a, 0.0]]], requires_grad=True)
    h = token_entropy(logits)
    p = 1 / (1 + math.exp(-a))
    assert h.item() == pytest.approx(-p * math.log(p) - (1 - p) * math.log(1 - p), rel=1e-6)
    h.sum().backward()
    assert logits.grad[0, 0, 0].item() == pytest.approx(-a * p * (1 - p), abs=1e-6)
    assert logits.grad[0, 0, 1].item() == pytest.approx(a * p * (1 - p), abs=1e-6)  # softmax shift invariance


def test_top_entropy_mask_keeps_highest_fraction_of_masked_tokens():
    # keep t under the mask with H_t >= the (1 - frac) quantile of the masked tokens' entropies
    entropy = torch.tensor([[0.1, 0.9, 5.0], [0.5, 0.3, 7.0]])  # 5.0 and 7.0 are padding
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    # masked values sorted [0.1, 0.3, 0.5, 0.9]: median 0.4, 0.75-quantile 0.5 + 0.25 * 0.4 = 0.6
    assert top_entropy_mask(entropy, mask, 0.5).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert top_entropy_mask(entropy, mask, 0.25).tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert top_entropy_mask(entropy, mask, 1.0).tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]


# -- shapes --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4,), (3, 1), (2,)])
def test_wrong_advantage_shape_raises_readable_error(shape):
    # advantages must be [N], one per sequence of logp [N, L]
    logp = torch.zeros(3, 2)
    with pytest.raises(AdvantageShapeError, match=r"shape \[3\]") as err:
        clip_loss(logp, logp, torch.zeros(shape), torch.ones(3, 2), agg=LossAgg.token_mean, **NO_IS)
    assert str(list(shape)) in str(err.value) and "3 sequences" in str(err.value)
    assert isinstance(err.value, ValueError)


# -- the learner's total: pg + kl_coef * kl - entropy_coef * entropy -----------------------------------------


class FixedLogits(nn.Module):
    """A 'model' whose last hidden states are a parameter [1, T, V], whatever the input, and whose LM head is the
    identity: the logits at each packed position are the parameter's."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits)
        self.lm_head = nn.Identity()
        self.config = SimpleNamespace(vocab_size=logits.shape[-1])

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, head: nn.Module) -> None:
        self.lm_head = head

    def forward(self, input_ids, position_ids, use_cache, packed_segments):
        assert input_ids.shape == self.logits.shape[:2]  # one packed row: the prompt and the response less its last
        return SimpleNamespace(logits=self.lm_head(self.logits))


def test_micro_loss_adds_kl_and_subtracts_entropy_bonus():
    # total = pg + beta * KL - c * H (sums, denominator 1), on-policy: pg = -sum_t A
    a = [0.7, -1.2]  # logits [a_t, 0] per response token; targets [1, 0]
    p = [1 / (1 + math.exp(-x)) for x in a]  # prob of token 0
    lp = [math.log(1 - p[0]), math.log(p[1])]
    model = FixedLogits(torch.tensor([[[a[0], 0.0], [a[1], 0.0]]]))
    ref = FixedLogits(torch.zeros(1, 2, 2))  # uniform: ref logp = log(1/2)
    algo = AlgoConfig(max_new_tokens=4, kl_coef=0.5, kl_estimator=KLEstimator.k1, entropy_coef=0.1, tis_cap=0.0)
    ids, attn, mask = torch.tensor([[0, 1, 0]]), torch.ones(1, 3, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool)
    micro = Micro(torch.tensor([0]), pack(ids, attn, mask, 1), mask, torch.tensor([lp]), torch.tensor([2.0]))
    out = micro_loss(model, ref, micro, algo, LossAgg.token_mean, configured_loss)
    ent = [-q * math.log(q) - (1 - q) * math.log(1 - q) for q in p]
    kl = sum(x - math.log(0.5) for x in lp)
    assert out.pg == pytest.approx(-4.0)
    assert out.kl == pytest.approx(kl, rel=1e-6) and out.ent == pytest.approx(sum(ent), rel=1e-6)
    assert out.total.item() == pytest.approx(-4.0 + 0.5 * kl - 0.1 * sum(ent), rel=1e-6)
    out.total.backward()
    # d logp_0 / d a_0 = -p_0, d logp_1 / d a_1 = 1 - p_1; d total = (-A + beta) d logp - c * (-a p (1 - p))
    dlp = [-p[0], 1 - p[1]]
    want = [(-2.0 + 0.5) * dlp[t] + 0.1 * a[t] * p[t] * (1 - p[t]) for t in range(2)]
    assert model.logits.grad[0, :, 0].tolist() == pytest.approx(want, rel=1e-5)


def test_step_sums_losses_sign_of_entropy_bonus():
    # batch loss = (pg + kl_coef * kl - entropy_coef * ent) / denominator
    step = SimpleNamespace(n_rows=2, resp_len=2, device=torch.device("cpu"))
    sums = StepSums(step)
    sums.add(torch.tensor([0]), torch.zeros(1, 2), {"pg": -4.0, "kl": 1.0, "ent": 2.0, "response_tokens": 2.0},
             {"ratio_max": Reduced(1.5, MAX)})
    sums.add(torch.tensor([1]), torch.zeros(1, 2), {"pg": 2.0, "kl": 0.5, "ent": 1.0, "response_tokens": 2.0},
             {"ratio_max": Reduced(1.1, MAX)})
    algo = AlgoConfig(kl_coef=0.5, entropy_coef=0.1)
    pg, kl, loss = sums.losses(0.25, algo)
    assert (pg, kl) == pytest.approx((-2.0 / 4, 1.5 / 4))
    assert loss == pytest.approx((-2.0 + 0.5 * 1.5 - 0.1 * 3.0) / 4)
    assert sums.metrics.values()["ratio_max"] == 1.5
