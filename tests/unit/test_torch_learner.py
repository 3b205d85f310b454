import math
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from helpers import algo_cfg, tiny_qwen2, tokens_for
from rlgen.algo.advantages import group_advantages
from rlgen.config import LossAgg, MonitorConfig
from rlgen.learners.actor import LearnerActor
from rlgen.learners.torch import NonFiniteWeightsError, TorchLearner
from rlgen.types import RolloutBatch

PAD = 0
# two prompts, two samples each; P = 4 (the first prompt is left-padded), L = 4 (responses right-padded)
PROMPTS = [[5, 6, 7], [5, 6, 7], [9, 4, 11, 3], [9, 4, 11, 3]]
RESPONSES = [[12, 13, 14], [15, 16], [17, 18, 19, 20], [21]]
REWARDS = [1.0, 0.0, 0.0, 1.0]
GROUPS = [0, 0, 1, 1]



@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    qwen = tiny_qwen2()
    # absolute position embeddings and dropout 0.1: wrong positions or live dropout show up as mismatch
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=32, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=1
        )
    )
    dirs = {}
    for name, model in (("qwen2", qwen), ("gpt2", gpt2)):
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        dirs[name] = str(path)
    return dirs


def unpadded_logprobs(model, prompt, response, temperature=1.0):
    """Logprobs of the response tokens from a forward of the bare, unpadded sequence."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0].float() / temperature  # [len, V]
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(response)]


def make_batch(model, prompts=PROMPTS, responses=RESPONSES, advantages=None, temperature=1.0):
    p_len = max(len(p) for p in prompts)
    r_len = max(len(r) for r in responses)
    ids, attn, rmask, elp = [], [], [], []
    for prompt, resp in zip(prompts, responses):
        lp = unpadded_logprobs(model, prompt, resp, temperature)
        left, right = p_len - len(prompt), r_len - len(resp)
        ids.append([PAD] * left + prompt + resp + [PAD] * right)
        attn.append([0] * left + [1] * (len(prompt) + len(resp)) + [0] * right)
        rmask.append([1.0] * len(resp) + [0.0] * right)
        elp.append(lp + [0.0] * right)
    n = len(prompts)
    rewards = torch.tensor(REWARDS[:n]) if n == len(REWARDS) else torch.zeros(n)
    groups = torch.tensor(GROUPS[:n]) if n == len(GROUPS) else torch.zeros(n, dtype=torch.long)
    if advantages is None:
        advantages = group_advantages(rewards, groups)
    return RolloutBatch(
        input_ids=torch.tensor(ids),
        attention_mask=torch.tensor(attn),
        response_mask=torch.tensor(rmask),
        engine_logprobs=torch.tensor(elp),
        rewards=rewards,
        advantages=torch.as_tensor(advantages, dtype=torch.float32),
        group_ids=groups,
        version=0,
        prompt_len=p_len,
    )


def load(path):
    return AutoModelForCausalLM.from_pretrained(path).eval()


def params_of(learner):
    return {k: v.detach().clone() for k, v in learner.model.named_parameters()}


def same_params(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
def test_one_step_updates_and_reports(model_dirs, kind):
    batch = make_batch(load(model_dirs[kind]))
    learner = TorchLearner(model_dirs[kind], algo_cfg(lr=1e-3), MonitorConfig())
    assert isinstance(learner, LearnerActor)
    before = params_of(learner)
    result = learner.train_step(batch)
    out = result.record()

    assert out["skipped"] is False and "skip_reason" not in out and result.skip_reason is None
    assert "version" not in result.metrics and "spans" not in result.metrics  # control data is typed
    assert out["version"] == 1 == learner.get_version()
    assert not same_params(before, params_of(learner))
    for key, value in out.items():
        if isinstance(value, float):
            assert math.isfinite(value), key
    # left padding + position ids reproduce the unpadded forward the engine logprobs came from
    assert out["mismatch/k3_kl"] < 1e-4
    assert out["mismatch/max_abs_delta"] < 1e-4
    assert out["mismatch/tokens"] == out["response_tokens"] == 10
    # rho = 1, A = [1, -1, -1, 1] over 3, 2, 4, 1 tokens: loss = -(3 - 2 - 4 + 1) / 10
    assert out["loss"] == pytest.approx(0.2, abs=1e-4)
    assert out["pg_loss"] == pytest.approx(out["loss"])
    assert out["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert out["clip_frac"] == 0.0 and out["seq_masked_frac"] == 0.0
    assert 0.0 < out["entropy"] <= math.log(32) + 1e-4
    assert out["grad_norm"] > 0.0
    (phase, start, end), *rest = result.spans
    assert phase == "train" and start <= end and not rest
    assert learner.health()["ok"] and learner.health()["version"] == 1


def test_get_weights_are_finite_cpu_copies(model_dirs):
    learner = TorchLearner(model_dirs["qwen2"], algo_cfg(), MonitorConfig())
    weights = learner.get_weights()
    assert set(weights) == set(learner.model.state_dict())
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in weights.values())
    name = "model.embed_tokens.weight"
    weights[name].zero_()
    assert learner.model.state_dict()[name].abs().sum() > 0  # a copy, not the live parameter
    assert all(t.dtype == torch.bfloat16 for t in learner.get_weights("bfloat16").values())


@pytest.mark.parametrize(
    ("agg", "micro", "drift_row"),
    [
        (LossAgg.token_mean, 1, None),
        (LossAgg.token_mean, 3, None),
        (LossAgg.token_mean, 3, 1),
        (LossAgg.seq_mean_token_mean, 3, 1),
        (LossAgg.seq_mean_token_sum_norm, 1, None),
    ],
)
def test_micro_batches_match_whole_batch(model_dirs, agg, micro, drift_row):
    path = model_dirs["qwen2"]
    batch = make_batch(load(path))
    seq_mask_cap = 0.0
    if drift_row is not None:  # one sequence's engine logprobs off by 1 per token: dropped at cap 2
        batch.engine_logprobs[drift_row] += batch.response_mask[drift_row]
        seq_mask_cap = 2.0
    results = []
    for micro_batch_size in (0, micro):
        algo = algo_cfg(lr=1e-2, loss_agg=agg, micro_batch_tokens=tokens_for(batch, micro_batch_size),
                        seq_mask_cap=seq_mask_cap)
        learner = TorchLearner(path, algo, MonitorConfig())
        outs = [learner.train_step(batch).record() for _ in range(2)]  # the second step sees ratios != 1
        results.append((outs, params_of(learner)))
    (whole, p_whole), (split, p_split) = results
    for a, b in zip(whole, split):
        for key in (
            "loss",
            "grad_norm",
            "clip_frac",
            "ratio_mean",
            "ratio_max",
            "seq_masked_frac",
            "entropy",
        ):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
        assert b["mismatch/k3_kl"] == pytest.approx(a["mismatch/k3_kl"], rel=1e-5, abs=1e-9)
    assert whole[0]["seq_masked_frac"] == (0.25 if drift_row is not None else 0.0)
    # Adam divides by |g|, so float noise in near-zero gradient entries moves a weight by a few 1e-6
    # out of the 2e-2 the two steps may move it
    for k in p_whole:
        torch.testing.assert_close(p_split[k], p_whole[k], rtol=0, atol=2e-5)


def test_positive_advantage_raises_the_token_logprob(model_dirs):
    path = model_dirs["qwen2"]
    prompts, responses = [[5, 6, 7], [5, 6, 7]], [[17], [23]]
    learner = TorchLearner(path, algo_cfg(lr=1e-2, max_new_tokens=1), MonitorConfig())
    start_good = unpadded_logprobs(learner.model, prompts[0], responses[0])[0]
    start_bad = unpadded_logprobs(learner.model, prompts[1], responses[1])[0]
    for _ in range(8):  # on-policy: engine logprobs from the current weights each step
        out = learner.train_step(make_batch(learner.model, prompts, responses, advantages=[1.0, -1.0])).record()
        assert not out["skipped"]
    end_good = unpadded_logprobs(learner.model, prompts[0], responses[0])[0]
    end_bad = unpadded_logprobs(learner.model, prompts[1], responses[1])[0]
    assert end_good > start_good + 1.0
    assert end_bad < start_bad - 1.0


def test_nan_gradient_skips_the_step(model_dirs):
    batch = make_batch(load(model_dirs["qwen2"]))
    learner = TorchLearner(model_dirs["qwen2"], algo_cfg(), MonitorConfig())
    param = learner.model.model.layers[0].mlp.up_proj.weight
    hook = param.register_hook(lambda g: torch.full_like(g, math.nan))
    before = params_of(learner)
    out = learner.train_step(batch).record()
    assert out["skipped"] is True
    assert out["skip_reason"] == "non-finite gradient norm (nan) at step 0"
    assert out["version"] == 0 == learner.get_version()
    assert same_params(before, params_of(learner))
    assert len(learner.optimizer.state) == 0
    assert all(torch.isfinite(t).all() for t in learner.get_weights().values())
    assert learner.health()["consecutive_skips"] == 1
    hook.remove()
    out = learner.train_step(batch).record()
    assert out["skipped"] is False and out["version"] == 1


def test_nan_advantage_skips_the_step(model_dirs):
    batch = make_batch(load(model_dirs["qwen2"]), advantages=[1.0, math.nan, -1.0, 0.0])
    learner = TorchLearner(model_dirs["qwen2"], algo_cfg(), MonitorConfig())
    before = params_of(learner)
    out = learner.train_step(batch).record()
    assert out["skipped"] is True and out["skip_reason"].startswith("non-finite")
    assert out["version"] == 0
    assert same_params(before, params_of(learner))


def test_non_finite_update_is_rolled_back(model_dirs):
    batch = make_batch(load(model_dirs["qwen2"]))
    learner = TorchLearner(model_dirs["qwen2"], algo_cfg(), MonitorConfig())
    learner.train_step(batch)
    before = params_of(learner)
    exp_avg = {id(p): s["exp_avg"].clone() for p, s in learner.optimizer.state.items()}
    learner.optimizer.param_groups[0]["lr"] = math.nan  # finite gradients, non-finite update
    out = learner.train_step(batch).record()
    assert out["skipped"] is True
    assert out["skip_reason"] == "non-finite parameters after the update at step 1"
    assert out["version"] == 1
    assert same_params(before, params_of(learner))
    for p, s in learner.optimizer.state.items():
        assert torch.equal(s["exp_avg"], exp_avg[id(p)])
    assert all(torch.isfinite(t).all() for t in learner.get_weights().values())


def test_get_weights_refuses_non_finite(model_dirs):
    learner = TorchLearner(model_dirs["qwen2"], algo_cfg(), MonitorConfig())
    with torch.no_grad():
        learner.model.model.norm.weight[0] = math.inf
    with pytest.raises(NonFiniteWeightsError, match="model.norm.weight"):
        learner.get_weights()


def test_kl_penalty_uses_a_frozen_reference(model_dirs):
    batch = make_batch(load(model_dirs["qwen2"]))
    assert "kl" not in TorchLearner(model_dirs["qwen2"], algo_cfg(), MonitorConfig()).train_step(batch).metrics
    learner = TorchLearner(model_dirs["qwen2"], algo_cfg(lr=1e-2, kl_coef=0.5), MonitorConfig())
    first = learner.train_step(batch).record()
    assert first["kl"] == pytest.approx(0.0, abs=1e-9)
    second = learner.train_step(batch).record()
    assert second["kl"] > 1e-6
    assert second["loss"] == pytest.approx(second["pg_loss"] + 0.5 * second["kl"])


def test_temperature_matches_the_engine_distribution(model_dirs):
    model = load(model_dirs["qwen2"])
    learner = TorchLearner(model_dirs["qwen2"], algo_cfg(temperature=0.5), MonitorConfig())
    assert learner.train_step(make_batch(model, temperature=0.5)).record()["mismatch/k3_kl"] < 1e-4
    learner = TorchLearner(model_dirs["qwen2"], algo_cfg(temperature=0.5), MonitorConfig())
    assert learner.train_step(make_batch(model, temperature=1.0)).record()["mismatch/max_abs_delta"] > 1e-3


def test_save_writes_a_loadable_checkpoint(model_dirs, tmp_path):
    learner = TorchLearner(model_dirs["qwen2"], algo_cfg(), MonitorConfig())
    learner.train_step(make_batch(load(model_dirs["qwen2"])))
    learner.save(str(tmp_path / "ckpt"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").state_dict()
    for name, tensor in learner.get_weights().items():
        torch.testing.assert_close(reloaded[name], tensor, rtol=0, atol=0)
    state = torch.load(os.path.join(tmp_path, "ckpt", "learner_state.pt"), weights_only=False)
    assert state["version"] == 1


@pytest.mark.parametrize("micro", [0, 1, 3])
def test_trainer_old_logprobs_measure_policy_change_not_staleness(model_dirs, micro):
    # The second step trains on the same batch after an update, so its engine logprobs are one version stale (as
    # with algo.async_steps=1). With old_logprobs=engine the ratio carries that staleness; with trainer it is 1 at
    # the update (pi_old recomputed by a no-grad forward before it), and the staleness goes into the capped IS
    # weight instead. Any micro-batch split gives the same step.
    path = model_dirs["qwen2"]
    batch = make_batch(load(path))
    outs = {}
    for old, size in (("engine", 0), ("trainer", 0), ("trainer", micro)):
        learner = TorchLearner(path, algo_cfg(lr=5e-2, old_logprobs=old, micro_batch_tokens=tokens_for(batch, size),
                                              clip_low=0.01, clip_high=0.01), MonitorConfig())
        outs[old, size] = [learner.train_step(batch).record() for _ in range(2)]
    stale_engine, stale_trainer = outs["engine", 0][1], outs["trainer", 0][1]
    assert stale_engine["ratio_max"] > 1.01 and stale_engine["clip_frac"] > 0  # the clip binds on staleness
    assert stale_trainer["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and stale_trainer["clip_frac"] == 0.0
    assert stale_trainer["mismatch/max_abs_delta"] == pytest.approx(stale_engine["mismatch/max_abs_delta"])
    for a, b in zip(outs["trainer", 0], outs["trainer", micro]):
        for key in ("loss", "grad_norm", "clip_frac", "tis_frac", "ratio_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
