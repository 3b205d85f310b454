"""On-policy distillation's maths and its place in the learner's step: each token's advantage is the formula of
rlgen.algo.distill for random logprobs, the teacher's scores are its teacher-forced logprobs, and the packed
learner step with the per-token term equals a padded reference written here (loss and every gradient)."""

from __future__ import annotations

import pytest
import torch
from test_packed_learner import (
    P,
    algo_of,
    logp_entropy,
    models,
    near_trainer,
    on_cpu,
    padded_logits,
    random_batch,
)

from helpers import tiny_qwen2, tokens_for
from rlgen.algo.distill import distill_term, reverse_kl, task_share
from rlgen.algo.inputs import LossInputs
from rlgen.algo.loss import AdvantageShapeError, broadcast_advantages, normaliser, rollout_keep
from rlgen.algo.registry import configured_loss
from rlgen.config import LossAgg
from rlgen.learners.grpo_step import StepSums, micro_loss
from rlgen.learners.teacher import teacher_logprobs


def test_each_tokens_advantage_is_the_formula_for_random_logprobs():
    g = torch.Generator().manual_seed(0)
    n, length = 7, 11
    teacher, engine = -torch.rand(n, length, generator=g) * 4, -torch.rand(n, length, generator=g) * 4
    mask = torch.rand(n, length, generator=g) > 0.3
    task = torch.randn(n, generator=g)
    for c in (0.0, 0.25, 1.0):
        term = distill_term(teacher, engine, mask, c)
        full = task_share(task, c).unsqueeze(-1) + term
        for i in range(n):
            for t in range(length):
                want = (1 - c) * task[i] + (c * (teacher[i, t] - engine[i, t]) if mask[i, t] else 0.0)
                assert float(full[i, t]) == pytest.approx(float(want), abs=1e-6)
    total, count = reverse_kl(teacher, engine, mask)
    assert count == int(mask.sum())
    assert total == pytest.approx(float(((engine - teacher) * mask).sum()), rel=1e-6)


def test_a_student_equal_to_its_teacher_gets_no_distillation_signal():
    logp = -torch.rand(3, 5) * 2
    mask = torch.ones(3, 5, dtype=torch.bool)
    assert torch.count_nonzero(distill_term(logp, logp, mask, 1.0)) == 0
    assert reverse_kl(logp, logp, mask) == (0.0, 15)


def test_losses_take_one_advantage_per_token_and_refuse_other_shapes():
    logp = torch.zeros(4, 6)
    assert broadcast_advantages(torch.ones(4), logp).shape == (4, 1)
    assert broadcast_advantages(torch.ones(4, 6), logp).shape == (4, 6)
    with pytest.raises(AdvantageShapeError, match="one value per sequence"):
        broadcast_advantages(torch.ones(4, 5), logp)


def test_the_teachers_scores_are_its_teacher_forced_logprobs():
    teacher = tiny_qwen2(5).eval()
    teacher.config._attn_implementation = "sdpa"
    batch = random_batch(3)
    algo = algo_of("distill", teacher="tiny", temperature=0.8)
    scores = teacher_logprobs(models(5)[1].eval(), on_cpu(batch, tokens_for(batch, 3)), algo)
    with torch.no_grad():
        want, _ = logp_entropy(padded_logits(teacher, batch.input_ids, batch.attention_mask, 0.8), batch.input_ids[:, P:])
    mask = batch.response_mask.bool()[:, : scores.logp.shape[1]]
    torch.testing.assert_close(scores.logp[mask], want[:, : scores.logp.shape[1]][mask], rtol=1e-5, atol=1e-5)
    ((phase, start, end),) = scores.spans
    assert torch.count_nonzero(scores.logp[~mask]) == 0 and phase == "teacher" and end >= start


def _padded_distill_step(model, teacher, batch, algo) -> tuple[float, torch.Tensor]:
    """The padded reference: one dense forward of the policy and the teacher, A_t by the formula, the loss."""
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask.bool()
    logp, _ = logp_entropy(padded_logits(model, ids, attn, algo.temperature), ids[:, P:])
    with torch.no_grad():
        t_logp, _ = logp_entropy(padded_logits(teacher, ids, attn, algo.temperature), ids[:, P:])
    adv = (1 - algo.distill_coef) * batch.advantages.unsqueeze(-1) \
        + algo.distill_coef * torch.where(mask, t_logp - batch.engine_logprobs, torch.zeros_like(t_logp))
    loss_mask = rollout_keep(logp.detach(), batch.engine_logprobs, mask, algo)
    inputs = LossInputs(logp=logp, old_logp=batch.engine_logprobs, engine_logp=batch.engine_logprobs, advantages=adv,
                        mask=mask, denominator=1.0)
    total = configured_loss(inputs, algo).loss
    denom = normaliser(loss_mask, algo.loss_agg, algo.max_new_tokens)
    (total / denom).backward()
    return float(total.detach()) / denom, adv


@pytest.mark.parametrize("holes", [False, True], ids=["turns", "episodes"])
@pytest.mark.parametrize(("policy_loss", "coef", "agg"), [("ppo_clip", 1.0, LossAgg.token_mean),
                                                          ("ppo_clip", 0.5, LossAgg.seq_mean_token_mean),
                                                          ("cispo", 0.3, LossAgg.token_mean)])
def test_packed_distillation_equals_padded(policy_loss, coef, agg, holes):
    padded, packed = models()
    t_padded, t_packed = models(9)
    t_padded, t_packed = t_padded.eval(), t_packed.eval()
    batch = near_trainer(padded, random_batch(1, holes), 2)
    algo = algo_of("distill", teacher="tiny", distill_coef=coef, policy_loss=policy_loss, loss_agg=agg,
                   micro_batch_tokens=tokens_for(batch, 3))
    want_loss, want_adv = _padded_distill_step(padded, t_padded, batch, algo)

    step = on_cpu(batch, algo.micro_batch_tokens)
    assert len(step.micro_rows) > 1  # packed into several micro-batches
    scores = teacher_logprobs(t_packed, step, algo)
    step = step.with_advantages(task_share(step.advantages, coef),
                                distill_term(scores.logp, step.engine_logp, step.mask, coef))
    sums = StepSums(step)
    for micro in step.micros():
        out = micro_loss(packed, None, micro, algo, LossAgg(algo.loss_agg), configured_loss)
        out.total.backward()
        sums.add(micro.rows, out.logp.detach(), out.sums())
        cols = micro.mask.shape[1]
        got_adv = micro.loss_advantages()
        torch.testing.assert_close(got_adv[micro.mask], want_adv[micro.rows, :cols][micro.mask], rtol=1e-4, atol=1e-5)
    denom = sums.get("denom")
    for p in packed.parameters():
        p.grad /= denom
    assert sums.losses(1.0 / denom, algo)[2] == pytest.approx(want_loss, rel=1e-5, abs=1e-6)
    mine = dict(packed.named_parameters())
    for name, p in padded.named_parameters():
        torch.testing.assert_close(mine[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_per_token_term_of_the_wrong_shape_is_refused():
    step = on_cpu(random_batch(2), 0)
    with pytest.raises(ValueError, match="per-token advantage"):
        step.with_advantages(step.advantages, torch.zeros(step.n_rows, step.resp_len + 1))
    term = torch.arange(step.n_rows * step.resp_len, dtype=torch.float32).reshape(step.n_rows, step.resp_len)
    moved = step.with_advantages(step.advantages, term).on(torch.device("cpu"))
    (micro,) = moved.micros()
    cols = micro.mask.shape[1]
    torch.testing.assert_close(micro.loss_advantages(), step.advantages[micro.rows].unsqueeze(-1) + term[micro.rows, :cols])


def _padded_full_step(model, teacher, batch, algo) -> tuple[float, torch.Tensor]:
    """The padded reference of algo.distill_estimator=full: the policy loss on (1 - c) A_task plus c times the
    aggregated KL_t = sum_v p_student (log p_student - log p_teacher), written out over the whole vocabulary."""
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask.bool()
    logits = padded_logits(model, ids, attn, algo.temperature)  # [N, L, V] at the response positions
    logp, _ = logp_entropy(logits, ids[:, P:])
    with torch.no_grad():
        t_all = torch.log_softmax(padded_logits(teacher, ids, attn, algo.temperature), dim=-1)
    s_all = torch.log_softmax(logits, dim=-1)
    kl = (s_all.exp() * (s_all - t_all)).sum(-1)  # [N, L]
    loss_mask = rollout_keep(logp.detach(), batch.engine_logprobs, mask, algo)
    adv = (1 - algo.distill_coef) * batch.advantages
    inputs = LossInputs(logp=logp, old_logp=batch.engine_logprobs, engine_logp=batch.engine_logprobs, advantages=adv,
                        mask=mask, denominator=1.0)
    from rlgen.algo.loss import aggregate

    total = configured_loss(inputs, algo).loss + algo.distill_coef * aggregate(
        kl, loss_mask, algo.loss_agg, algo.max_new_tokens, denominator=1.0)
    denom = normaliser(loss_mask, algo.loss_agg, algo.max_new_tokens)
    (total / denom).backward()
    return float(total.detach()) / denom, kl.detach()


@pytest.mark.parametrize(("coef", "agg"), [(1.0, LossAgg.token_mean), (0.5, LossAgg.seq_mean_token_mean)])
def test_the_full_estimator_packed_equals_its_formula_padded(coef, agg):
    padded, packed = models()
    t_padded, t_packed = models(9)
    t_padded, t_packed = t_padded.eval(), t_packed.eval()
    batch = near_trainer(padded, random_batch(1), 2)
    algo = algo_of("distill", teacher="tiny", distill_coef=coef, loss_agg=agg, distill_estimator="full",
                   micro_batch_tokens=tokens_for(batch, 3), temperature=0.9)
    want_total, want_kl = _padded_full_step(padded, t_padded, batch, algo)
    step = on_cpu(batch, algo.micro_batch_tokens)
    step = step.with_advantages(task_share(step.advantages, coef), None)
    assert len(step.micro_rows) > 1
    sums, total = StepSums(step), 0.0
    for micro in step.micros():
        out = micro_loss(packed, None, micro, algo, LossAgg(algo.loss_agg), configured_loss, teacher=t_packed)
        out.total.backward()
        total += float(out.total.detach())
        sums.add(micro.rows, out.logp.detach(), out.sums(), out.metrics)
    denom = sums.get("denom")
    mask = batch.response_mask.bool()
    assert total / denom == pytest.approx(want_total, rel=1e-5, abs=1e-6)
    assert sums.losses(1.0 / denom, algo)[2] == pytest.approx(want_total, rel=1e-5, abs=1e-6)  # the loss logged
    # the step's distill/reverse_kl is the mean of KL_t over the response tokens
    assert sums.metrics.values()["distill/reverse_kl"] == pytest.approx(float(want_kl[mask].mean()), rel=1e-5)
    assert float(want_kl[mask].min()) >= -1e-6 and float(want_kl[mask].mean()) > 1e-3  # a KL, and one that speaks
    mine = dict(packed.named_parameters())
    for name, p in padded.named_parameters():
        torch.testing.assert_close(mine[name].grad / denom, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert all(p.grad is None for p in t_packed.parameters())  # the teacher stays frozen


def test_a_student_equal_to_its_teacher_has_no_full_reverse_kl():
    padded, packed = models()
    _, same = models()  # the same seed: the same weights
    batch = near_trainer(padded, random_batch(2), 2)
    algo = algo_of("distill", teacher="tiny", distill_estimator="full", micro_batch_tokens=tokens_for(batch, 2))
    step = on_cpu(batch, algo.micro_batch_tokens)
    for micro in step.micros():
        out = micro_loss(packed, None, micro, algo, LossAgg(algo.loss_agg), configured_loss, teacher=same.eval())
        assert abs(out.metrics["distill/reverse_kl"]) < 1e-6
