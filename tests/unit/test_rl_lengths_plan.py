"""What the plan decides for real RL lengths: the packed-attention kernel (chosen once, shown with why), the
engine's max_model_len from the prompt and response bounds, RL-shaped lengths for random-weight models
(task.response_length_mean), a step prediction that reads the lengths rather than the cap, and the generation
tail as the driver measures it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.generated import GenResult
from rlgen.plan import PlanError, build_plan
from rlgen.plan import attention as plan_attention
from rlgen.plan.lengths import longest_response
from rlgen.plan.prediction import predict
from rlgen.runtime.rollouts.tail import tail_metrics
from rlgen.tasks.prompts import length_stop_ids
from rlgen.types import tail_start

GPU = ["engine=vllm", "hardware=1xh200", "model=qwen2_5_0_5b"]


def setting(plan, key):
    (found,) = [s for s in plan.settings if s.key == key]
    return found


def plan_of(*overrides):
    return build_plan(compose_run_config(list(overrides)))


def test_the_attention_kernel_is_chosen_once_by_what_is_present(monkeypatch):
    cpu = setting(plan_of(), "learner.attention")
    assert (cpu.value, cpu.source) == ("sdpa_segments", "derived: causal SDPA over each packed row in turn (CPU)")
    monkeypatch.setattr(plan_attention, "_torch_version", lambda: (2, 11))
    monkeypatch.setattr(plan_attention, "_installed", lambda name: False)
    gpu = setting(plan_of(*GPU), "learner.attention")
    assert gpu.value == "torch_varlen" and "flash_attn: flash-attn is not installed" in gpu.source
    assert plan_of(*GPU).config.learner.attention == "torch_varlen"  # what the learners are built with
    monkeypatch.setattr(plan_attention, "_installed", lambda name: True)  # flash-attn installed
    assert setting(plan_of(*GPU), "learner.attention").value == "flash_attn"
    monkeypatch.setattr(plan_attention, "_installed", lambda name: False)
    fp32 = setting(plan_of(*GPU, "learner.kind=torch"), "learner.attention")  # the torch learner trains in fp32
    assert fp32.value == "sdpa_segments" and "the torch learner trains in float32" in fp32.source
    monkeypatch.setattr(plan_attention, "_torch_version", lambda: (2, 9))  # no varlen in torch before 2.10
    assert setting(plan_of(*GPU), "learner.attention").value == "sdpa_segments"


@pytest.mark.parametrize(("overrides", "said"), [
    (["learner.attention=torch_varlen"], "runs on CUDA GPUs only; use learner.attention=sdpa_segments"),
    (["learner.attention=xformers"], "learner.attention=xformers is not an attention backend; choose one of: auto"),
    ([*GPU, "learner.kind=torch", "learner.attention=torch_varlen"], "the torch learner trains in float32"),
])
def test_an_attention_kernel_that_cannot_run_is_refused(overrides, said):
    with pytest.raises(PlanError) as err:
        plan_of(*overrides)
    assert any(said in p for p in err.value.problems)


def test_a_set_kernel_is_taken_and_said_so():
    assert (setting(plan_of("learner.attention=sdpa_segments"), "learner.attention").source) == "config"


def test_max_model_len_follows_the_prompt_and_response_bounds():
    long = plan_of("engine=vllm", "hardware=1xh200", "model=qwen2_5_1_5b", "algo.max_new_tokens=16384",
                   "task.max_prompt_tokens=16", "algo.prompts_per_step=4")
    derived = setting(long, "engine.max_model_len")
    assert derived.value == 16400 == long.config.engine.max_model_len
    assert derived.source == "derived: task.max_prompt_tokens + algo.max_new_tokens"
    episodes = plan_of("engine=vllm", "hardware=1xh200", "model=qwen2_5_0_5b", "task=chain",
                       "task.max_total_tokens=3000", "algo.max_new_tokens=64")
    assert episodes.config.engine.max_model_len == episodes.config.task.max_prompt_tokens + 3000
    assert plan_of(*GPU, "engine.max_model_len=4096").config.engine.max_model_len == 4096  # a set one wins


def test_rl_shaped_lengths_come_from_stop_ids_of_the_mean():
    ids = length_stop_ids(151_936, 256, seed=0, keep=[0, 1, 151_643])
    assert len(ids) == 593 == 151_936 // 256 and len(set(ids)) == 593
    assert not {0, 1, 151_643} & set(ids) and all(0 <= i < 151_936 for i in ids)
    assert ids == length_stop_ids(151_936, 256, seed=0, keep=[0, 1, 151_643])  # the same run, the same ids
    assert ids != length_stop_ids(151_936, 256, seed=1, keep=[0, 1, 151_643])
    assert length_stop_ids(151_936, 0, seed=0) == []
    with pytest.raises(PlanError, match="task.response_length_mean=-1 must be >= 0"):
        plan_of("task.response_length_mean=-1")


def test_the_prediction_reads_rl_lengths_not_the_cap():
    base = [*GPU, "algo.prompts_per_step=64", "algo.max_new_tokens=2048", "engine.max_model_len=2064"]
    capped = predict(plan_of(*base))
    shaped = predict(plan_of(*base, "task.response_length_mean=256"))
    # the mean of geometric lengths of mean 256 cut at 2,048
    assert shaped.response_tokens == pytest.approx(256 * (1 - 2.718281828 ** (-2048 / 256)), rel=1e-6)
    assert shaped.train_tokens < capped.train_tokens / 6  # the learner trains the real tokens
    assert shaped.train_s < capped.train_s / 3
    # generation waits for the longest response of an engine's 256 sequences: ~256 x (ln 256 + 0.58) steps
    assert longest_response(256, 256, 2048) == pytest.approx(256 * (5.545 + 0.5772), rel=1e-3)
    assert capped.gen_s / 8 < shaped.gen_s < capped.gen_s


def test_a_calls_tail_starts_when_nine_in_ten_requests_are_done():
    assert tail_start([]) is None
    assert tail_start([5.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0]) == 9.0
    assert tail_start([3.0]) == 3.0


def test_the_tail_and_what_the_next_batch_fills_of_it():
    def flight(results, launched=None, engines=2):
        return SimpleNamespace(results=results, launched_at=launched, shards=[[object()]] * engines)

    done = flight({0: GenResult([], 0, spans=[("generate", 0.0, 10.0)], tail_from=8.0),
                   1: GenResult([], 0, spans=[("generate", 0.0, 10.0)], tail_from=9.0)})
    assert tail_metrics(done, None) == {"gen/tail_s": 2.0, "gen/tail_filled": 0.0}
    # the next batch launched at 9.0: it filled 1 s of engine 0's 2-s tail and all of engine 1's 1-s tail
    assert tail_metrics(done, flight({}, launched=9.0)) == {"gen/tail_s": 2.0, "gen/tail_filled": 2.0 / 3.0}
    assert tail_metrics(done, flight({}, launched=5.0))["gen/tail_filled"] == 1.0
    assert tail_metrics(flight({0: GenResult([], 0, spans=[("generate", 0.0, 1.0)])}), None) == {}  # no tail (hf)


def test_partial_rollouts_shorten_the_awaited_tail_to_a_quantile_of_the_groups_longest():
    import math

    from rlgen.plan.lengths import awaited_response, longest_response

    # 64 groups of 8, mean 250, cap 2048: without partial rollouts the batch waits for its longest of 512
    whole = awaited_response(250, 512, 2048, group=8)
    assert whole == longest_response(250, 512, 2048) == pytest.approx(250 * (math.log(512) + 0.5772))
    # with a quarter more groups it waits until 80% of its groups are done: a group's longest at its 0.8 quantile
    part = awaited_response(250, 512, 2048, group=8, share=0.25)
    assert (1 - math.exp(-part / 250)) ** 8 == pytest.approx(0.8)
    assert part < 0.6 * whole
    assert awaited_response(250, 512, 300, group=8, share=0.25) == 300  # never past the cap
