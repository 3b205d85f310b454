"""The registries of advantage estimators and policy losses, and the algorithms added through them (RLOO,
REINFORCE++, CISPO), on small examples computed by hand from the papers' equations (docs/algorithms.md), plus the
trainer's own old logprobs (algo.old_logprobs=trainer) against the engine's."""

import math
import subprocess
import sys

import pytest
import torch

from helpers import algo_cfg, clip_loss
from rlgen.algo.registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    advantage_estimator,
    algorithm,
    algorithm_problems,
    policy_loss,
    register_advantage,
    register_policy_loss,
    unregister_advantage,
    unregister_policy_loss,
)
from rlgen.config import ISMode, Level, LossAgg


def close(got: torch.Tensor, want: list) -> None:
    torch.testing.assert_close(got.detach(), torch.tensor(want, dtype=got.dtype), rtol=1e-5, atol=1e-6)


# -- the registries ------------------------------------------------------------------------------------------


def test_every_registered_name_resolves_to_a_function():
    for name in ADVANTAGE_ESTIMATORS:
        assert callable(advantage_estimator(name))
    for name in POLICY_LOSSES:
        assert callable(policy_loss(name))


def test_checking_names_imports_no_torch():
    code = ("import sys; from rlgen.algo.registry import algorithm_problems; from rlgen.config import AlgoConfig; "
            "assert algorithm_problems(AlgoConfig(kind='cispo', advantage='rloo', policy_loss='cispo')) == []; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_names_get_one_sentence_each_with_the_choices():
    problems = algorithm_problems(algo_cfg(kind="grpo", advantage="gae", policy_loss="dpo"))
    assert problems == [
        "algo.advantage=gae is not an advantage estimator; choose one of: grpo, reinforce_pp, reinforce_pp_baseline, "
        "rloo (or add yours with rlgen.algo.registry.register_advantage).",
        "algo.policy_loss=dpo is not a policy loss; choose one of: cispo, ppo_clip (or add yours with "
        "rlgen.algo.registry.register_policy_loss).",
    ]


def test_registered_functions_are_what_the_algorithm_calls():
    seen = []
    register_advantage("count", lambda rewards, groups, algo: seen.append("adv") or rewards * 0)
    register_policy_loss("noted", lambda inputs, algo: seen.append("loss") or inputs)
    try:
        algo = algo_cfg(advantage="count", policy_loss="noted")
        assert algorithm_problems(algo) == []
        run = algorithm("grpo")  # the preset's name is a label; the config picks the functions
        assert run.advantages(torch.ones(2), torch.zeros(2), algo).tolist() == [0.0, 0.0]
        assert run.loss("inputs", algo) == "inputs"
        assert seen == ["adv", "loss"]
    finally:
        unregister_advantage("count")
        unregister_policy_loss("noted")
    assert "count" not in ADVANTAGE_ESTIMATORS and "noted" not in POLICY_LOSSES


# -- RLOO ----------------------------------------------------------------------------------------------------


def test_rloo_leave_one_out_baseline():
    # A_i = r_i - mean of the other rewards of i's prompt.
    # group 0, r = [1, 0, 0, 1]: 1 - (0+0+1)/3 = 2/3, 0 - (1+0+1)/3 = -2/3 (= 4/3 (r - 0.5))
    # group 1, r = [0.5, 0.5]: all equal -> 0; group 2, r = [3, nan, 1]: the NaN takes no part and gets 0,
    # 3 - 1 = 2, 1 - 3 = -2; group 3, one reward: no other sample, 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 3.0, math.nan, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 3])
    adv = advantage_estimator("rloo")(rewards, groups, algo_cfg())
    close(adv, [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 2.0, 0.0, -2.0, 0.0])


# -- REINFORCE++ ---------------------------------------------------------------------------------------------


def test_reinforce_pp_whitens_over_the_batch():
    # finite r = [1, 0, 0, 1, 1]: mean 0.6, population var (3 * 0.4^2 + 2 * 0.6^2) / 5 = 0.24; A = (r - 0.6) / sqrt(0.24)
    # whatever the groups (a group of equal rewards still gets a signal); the NaN gets 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, math.nan])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    s = math.sqrt(0.24)
    close(advantage_estimator("reinforce_pp")(rewards, groups, algo_cfg()),
          [0.4 / s, -0.6 / s, -0.6 / s, 0.4 / s, 0.4 / s, 0.0])


def test_reinforce_pp_baseline_centres_on_the_group_then_whitens_over_the_batch():
    # group means: g0 [1, 0] -> 0.5, g1 [1, 1] -> 1, g2 [0, 0, 1] -> 1/3
    # a = [0.5, -0.5, 0, 0, -1/3, -1/3, 2/3]: mean 0, var (0.25 + 0.25 + 1/9 + 1/9 + 4/9) / 7 = 1/6
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    s = math.sqrt(1 / 6)
    close(advantage_estimator("reinforce_pp_baseline")(rewards, groups, algo_cfg()),
          [0.5 / s, -0.5 / s, 0.0, 0.0, -1 / 3 / s, -1 / 3 / s, 2 / 3 / s])


def test_reinforce_pp_plans_one_sample_a_prompt_and_group_estimators_do_not():
    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan

    plan = build_plan(compose_run_config(["algo=reinforce_pp", "algo.samples_per_prompt=1"]))
    assert plan.batch.samples_per_prompt == 1 and plan.batch.sequences_per_step == plan.batch.prompts_per_step
    for advantage in ("grpo", "rloo", "reinforce_pp_baseline"):
        assert algorithm_problems(algo_cfg(advantage=advantage)) == []
        with pytest.raises(Exception, match=f"algo.advantage={advantage} compares the samples of a prompt"):
            build_plan(compose_run_config(["algo=reinforce_pp", f"algo.advantage={advantage}",
                                           "algo.samples_per_prompt=1"]))


def test_reinforce_pp_whitens_a_batch_of_one_sample_a_prompt():
    # every sample its own group: advantages are the batch-whitened rewards, not 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = advantage_estimator("reinforce_pp")(rewards, torch.arange(4), algo_cfg(samples_per_prompt=1))
    close(adv, [1.0, -1.0, -1.0, 1.0])


# -- CISPO ---------------------------------------------------------------------------------------------------


def _cispo_example():
    engine = torch.full((2, 2), -1.0)
    # row 0 (A = +1): r = [1.5, 1]; row 1 (A = -1): r = [0.5, 1.1]
    logp = (engine + torch.tensor([[math.log(1.5), 0.0], [math.log(0.5), math.log(1.1)]])).requires_grad_()
    return engine, logp, torch.tensor([1.0, -1.0])


def test_cispo_clips_the_weight_and_keeps_every_gradient():
    # J = (1/4) sum_t sg(clip(r_t, 1 - eps_low, 1 + eps_high)) A logp_t, token mean over 4 tokens.
    # eps_low = 1 (no lower bound, the paper's), eps_high = 0.2: weights [1.2, 1] and [0.5, 1.1]
    engine, logp, adv = _cispo_example()
    loss, metrics = clip_loss(logp, engine, adv, torch.ones(2, 2), agg=LossAgg.token_mean, loss="cispo",
                              clip_low=1.0, clip_high=0.2, tis_cap=0.0)
    lp = [[-1 + math.log(1.5), -1.0], [-1 + math.log(0.5), -1 + math.log(1.1)]]
    want = -(1.2 * lp[0][0] + 1.0 * lp[0][1] - 0.5 * lp[1][0] - 1.1 * lp[1][1]) / 4
    assert loss.item() == pytest.approx(want, rel=1e-6)
    loss.backward()
    # d loss / d logp_t = -w_t A / 4: the clipped token (r = 1.5) keeps a gradient, unlike PPO's clip
    close(logp.grad, [[-1.2 / 4, -1.0 / 4], [0.5 / 4, 1.1 / 4]])
    assert metrics["clip_frac"] == pytest.approx(1 / 4)


def test_cispo_with_a_lower_bound():
    # eps_low = 0.2: row 1's r = 0.5 is raised to 0.8, so its gradient is 0.8 / 4
    engine, logp, adv = _cispo_example()
    loss, metrics = clip_loss(logp, engine, adv, torch.ones(2, 2), agg=LossAgg.token_mean, loss="cispo",
                              clip_low=0.2, clip_high=0.2, tis_cap=0.0)
    loss.backward()
    close(logp.grad, [[-1.2 / 4, -1.0 / 4], [0.8 / 4, 1.1 / 4]])
    assert metrics["clip_frac"] == pytest.approx(2 / 4)


def _cispo_weights(w: list[float], **settings) -> list[float]:
    """The weight each token's logprob gradient gets under cispo (A = 1, token sum), for trainer/engine ratios w
    at the update (the trainer before the update equals the current policy): -d loss / d logp_t."""
    engine = torch.full((1, len(w)), -2.0)
    trainer = engine + torch.tensor([[math.log(x) for x in w]])
    logp = trainer.clone().requires_grad_()
    old = trainer if settings.pop("old", "engine") == "trainer" else None
    loss, _ = clip_loss(logp, engine, torch.tensor([1.0]), torch.ones(1, len(w)), agg=LossAgg.token_mean,
                        denominator=1.0, old_logp=old, loss="cispo", clip_low=1.0, **settings)
    loss.backward()
    return (-logp.grad[0]).tolist()


@pytest.mark.parametrize(("old", "clip_high", "tis_cap", "want"), [
    # pi_old = the engine's: the ratio is w, clipped at hi = 1.2; the cap 2 is the same bound on the same w, so a
    # w above both gets min(hi, cap) = 1.2 once (the old double cap gave 1.2 * 2 / w = 0.8 at w = 3)
    ("engine", 0.2, 2.0, [1.1, 1.2, 1.2]),
    ("engine", 1.5, 2.0, [1.1, 2.0, 2.0]),  # hi = 2.5 above the cap: the cap binds, at 2
    ("engine", 0.2, 0.0, [1.1, 1.2, 1.2]),  # no cap: CISPO's clip alone
    # pi_old = the trainer's: the ratio is 1 at the update, the mismatch a factor of its own: min(w, cap)
    ("trainer", 0.2, 2.0, [1.1, 1.5, 2.0]),
    ("trainer", 0.2, 0.0, [1.0, 1.0, 1.0]),  # no cap: no correction, the mismatch is not weighed at all
])
def test_cispo_caps_the_mismatch_once(old, clip_high, tis_cap, want):
    # w below 1.2, between 1.2 and the cap 2 (1.5 or 2.2) and above the cap (3), docs/algorithms.md section 3
    w = [1.1, 1.5 if clip_high < 1 else 2.2, 3.0]
    got = _cispo_weights(w, old=old, clip_high=clip_high, tis_cap=tis_cap)
    assert got == pytest.approx(want, rel=1e-5)


def test_cispo_mask_mode_drops_the_tokens_over_the_cap():
    # tis_mode=mask: a token whose w exceeds the cap leaves the numerator; the others keep CISPO's weight
    got = _cispo_weights([1.1, 1.5, 3.0], clip_high=0.2, tis_cap=2.0, tis_mode=ISMode.mask)
    assert got == pytest.approx([1.1, 1.2, 0.0], rel=1e-5)


# -- old_logprobs=trainer: the ratio against the trainer, the mismatch in its own weight ----------------------


def test_trainer_old_logprobs_keep_mismatch_out_of_the_ratio():
    # trainer == old (before the update), engine off by [log 3, log 1.5]: rho = 1, IS weight min(exp(old - engine), 2)
    # = [2, 1.5] (token, truncate); loss = -(2 A + 1.5 A) / 2 with A = 1; gradient -w A rho / 2
    engine = torch.tensor([[-2.0, -2.0]])
    old = engine + torch.tensor([[math.log(3.0), math.log(1.5)]])
    logp = old.clone().requires_grad_()
    loss, metrics = clip_loss(logp, engine, torch.tensor([1.0]), torch.ones(1, 2), agg=LossAgg.token_mean,
                              old_logp=old, tis_cap=2.0)
    assert loss.item() == pytest.approx(-1.75)
    loss.backward()
    close(logp.grad, [[-1.0, -0.75]])
    assert metrics["clip_frac"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["tis_frac"] == pytest.approx(1 / 2)
    # mask mode: the token over the cap leaves the numerator and the denominator, the other keeps its weight 1.5
    loss, _ = clip_loss(logp, engine, torch.tensor([1.0]), torch.ones(1, 2), agg=LossAgg.token_mean, old_logp=old,
                        tis_cap=2.0, tis_mode=ISMode.mask)
    assert loss.item() == pytest.approx(-1.5)
    # the engine's logprobs as pi_old: the same mismatch is a ratio of [3, 1.5], clipped at 1.2 on both tokens
    _, metrics = clip_loss(logp, engine, torch.tensor([1.0]), torch.ones(1, 2), agg=LossAgg.token_mean, tis_cap=2.0)
    assert metrics["clip_frac"] == 1.0


def test_trainer_sequence_is_weight_is_one_weight_per_sequence():
    # tis_level=sequence under old_logprobs=trainer: w_i = exp(mean_t (old - engine)), capped; row 0: mean of
    # [log 4, 0] = log 2 -> 2 capped at 1.5; row 1: mean of [log 1.2, log 1.2] -> 1.2. Ratio 1, A = 1, token mean of 4.
    engine = torch.zeros(2, 2)
    old = torch.tensor([[math.log(4.0), 0.0], [math.log(1.2), math.log(1.2)]])
    loss, metrics = clip_loss(old.clone().requires_grad_(), engine, torch.ones(2), torch.ones(2, 2),
                              agg=LossAgg.token_mean, old_logp=old, tis_cap=1.5, tis_level=Level.sequence)
    assert loss.item() == pytest.approx(-(1.5 * 2 + 1.2 * 2) / 4)
    assert metrics["tis_frac"] == pytest.approx(2 / 4)


def test_gspo_clip_binds_on_mismatch_alone_only_with_engine_old_logprobs():
    # i.i.d. engine/trainer noise of 1e-3..1e-2 per token and no policy change: with pi_old = the engine's, GSPO's
    # 3e-4/4e-4 clip counts as clipped every sequence whose mean noise leaves the range; with the trainer's, none.
    g = torch.Generator().manual_seed(0)
    trainer = -torch.rand(64, 16, generator=g) * 3
    noise = (torch.rand(64, 16, generator=g) * 9e-3 + 1e-3) * torch.sign(torch.randn(64, 16, generator=g))
    engine = trainer + noise
    gspo = dict(agg=LossAgg.seq_mean_token_mean, importance_level=Level.sequence, tis_level=Level.sequence,
                clip_low=3e-4, clip_high=4e-4)
    adv = torch.sign(torch.randn(64, generator=g))
    _, with_engine = clip_loss(trainer.clone(), engine, adv, torch.ones(64, 16), **gspo)
    _, with_trainer = clip_loss(trainer.clone(), engine, adv, torch.ones(64, 16), old_logp=trainer, **gspo)
    assert with_engine["clip_frac"] > 0.1
    assert with_trainer["clip_frac"] == 0.0
