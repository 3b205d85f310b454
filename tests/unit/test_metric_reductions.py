"""Metrics that say how they reduce (rlgen.metrics.reduce): a new loss's metric reaches the step's metrics, reduced
over micro-batches and over the learner group's ranks as the loss declared it; the built-in ones keep their
reductions; a reduction over a count a micro-batch does not have is refused in a sentence naming the metric."""

from __future__ import annotations

import math

import pytest
import torch
from test_packed_learner import algo_of, models, near_trainer, on_cpu, random_batch

from helpers import algo_cfg, save_tiny_qwen2, tokens_for
from rlgen.algo.ppo_clip import ppo_clip_loss
from rlgen.algo.registry import register_policy_loss, unregister_policy_loss
from rlgen.config import LossAgg, MonitorConfig
from rlgen.learners.group import merge_results
from rlgen.learners.grpo_step import StepSums, micro_loss
from rlgen.learners.torch import TorchLearner
from rlgen.metrics.reduce import MAX, SEQ_MEAN, SUM, MicroMetrics, Reduced, mean_over, merge


def with_my_metrics(inputs, algo):
    """ppo_clip plus three metrics of a loss of one's own: a plain one (a mean over response tokens), a maximum and
    a sum."""
    out = ppo_clip_loss(inputs, algo)
    m = inputs.mask.bool()
    logp = inputs.logp.detach()[m]
    out.metrics.update({"my/neg_logp": float(-logp.mean()) if m.any() else 0.0,
                        "my/worst": Reduced(float(-logp.min()) if m.any() else 0.0, MAX),
                        "my/tokens": Reduced(float(m.sum()), SUM)})
    return out


def test_a_reduced_metric_is_its_value_and_keeps_its_reduction_across_a_pickle():
    import pickle

    v = Reduced(0.25, MAX)
    assert v == 0.25 and v + 1 == 1.25 and math.isfinite(v) and f"{v:.2f}" == "0.25"
    back = pickle.loads(pickle.dumps(v))
    assert back == 0.25 and back.how == MAX


def test_micro_batches_reduce_each_metric_as_it_says():
    acc = MicroMetrics()
    acc.add({"a": 1.0, "b": Reduced(3.0, MAX), "c": Reduced(2.0, SUM), "d": Reduced(0.5, SEQ_MEAN)},
            {"response_tokens": 10, "loss_tokens": 8, "sequences": 2})
    acc.add({"a": 4.0, "b": Reduced(1.0, MAX), "c": Reduced(5.0, SUM), "d": Reduced(1.0, SEQ_MEAN)},
            {"response_tokens": 30, "loss_tokens": 30, "sequences": 6})
    got = acc.values()
    assert got["a"] == pytest.approx((1 * 10 + 4 * 30) / 40) and got["b"] == 3.0 and got["c"] == 7.0
    assert got["d"] == pytest.approx((0.5 * 2 + 1.0 * 6) / 8)
    with pytest.raises(ValueError, match="'e' reduces by 'mean:rows'"):
        acc.add({"e": Reduced(1.0, mean_over("rows"))}, {"response_tokens": 1})


def test_ranks_merge_by_the_declared_reductions():
    a = {"x": 0.2, "n": 10, "top": 1.0, "s": 3, "g": 5.0}
    b = {"x": 0.6, "n": 30, "top": math.nan, "s": 4, "g": 7.0}
    got = merge([a, b], {"x": mean_over("n"), "n": SUM, "top": MAX, "s": SUM})
    assert got["x"] == pytest.approx(0.5) and got["n"] == 40 and isinstance(got["n"], int)
    assert math.isnan(got["top"]) and got["s"] == 7 and got["g"] == 5.0  # g declared nothing: rank 0's


def test_a_new_losss_metrics_reach_the_steps_metrics_reduced_over_micro_batches():
    _, packed = models()
    batch = near_trainer(packed, random_batch(1), 2)
    algo = algo_of("grpo", micro_batch_tokens=tokens_for(batch, 3))
    step = on_cpu(batch, algo.micro_batch_tokens)
    assert len(step.micro_rows) > 1
    sums = StepSums(step)
    parts = []
    for micro in step.micros():
        out = micro_loss(packed, None, micro, algo, LossAgg(algo.loss_agg), with_my_metrics)
        sums.add(micro.rows, out.logp.detach(), out.sums(), out.metrics)
        parts.append((out.metrics, int(micro.mask.sum())))
    got = sums.metrics.values()
    tokens = sum(n for _, n in parts)
    assert got["my/neg_logp"] == pytest.approx(sum(m["my/neg_logp"] * n for m, n in parts) / tokens, rel=1e-6)
    assert got["my/worst"] == max(m["my/worst"] for m, n in parts if n)
    assert got["my/tokens"] == tokens
    assert sums.metrics.hows["clip_frac"] == mean_over("loss_tokens")  # the built-in ones keep theirs


def test_a_learner_group_reports_a_new_losss_metric_merged_as_declared(tmp_path):
    register_policy_loss("with_my_metrics", with_my_metrics)
    try:
        path = save_tiny_qwen2(tmp_path / "m")
        algo = algo_cfg(policy_loss="with_my_metrics")
        learner = TorchLearner(path, algo, MonitorConfig())
        _, packed = models()
        batches = [near_trainer(packed, random_batch(seed), seed) for seed in (1, 3)]
        results = [learner.train_step(b) for b in batches]  # two shards, as two ranks would report them
        for r in results:
            assert {"my/neg_logp", "my/worst", "my/tokens", "clip_frac", "ratio_max"} <= set(r.metrics)
            assert r.reductions["my/worst"] == MAX and r.reductions["loss"] == SUM
        merged = merge_results(results).metrics
        a, b = (r.metrics for r in results)
        assert merged["my/tokens"] == a["my/tokens"] + b["my/tokens"]
        assert merged["my/worst"] == max(a["my/worst"], b["my/worst"])
        want = (a["my/neg_logp"] * a["response_tokens"] + b["my/neg_logp"] * b["response_tokens"]) \
            / (a["response_tokens"] + b["response_tokens"])
        assert merged["my/neg_logp"] == pytest.approx(want)
        assert torch.isfinite(torch.tensor(merged["loss"]))
    finally:
        unregister_policy_loss("with_my_metrics")
