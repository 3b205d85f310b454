"""Balancer verdicts on synthetic timelines: generation-bound, training-bound, balanced, noisy flips."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlgen.metrics.balance import (
    BalanceContext,
    BalanceTracker,
    Kind,
    StepBalance,
    assess,
    classify,
    measure,
    measure_record,
    summarize,
)
from rlgen.metrics.balance_context import context_from_plan
from rlgen.types import Phase, StepTimeline


def on_policy_record(step: int, gen: float, train: float, *, t0: float = 1000.0, engine_sync: float = 0.01,
                     reward: float = 0.01, learner_sync: float = 0.01, engines: int = 1, tokens: int = 1000) -> dict:
    """One strictly on-policy step laid out as the loop records it.

    learner wait = engine weight load + generation; then the driver scores, the learner trains and exports.
    """
    tl = StepTimeline(step)
    wait_end = t0 + engine_sync + gen
    tl.add("learner0", Phase.wait, t0, wait_end)
    for e in range(engines):
        tl.add(f"engine{e}", Phase.sync, t0, t0 + engine_sync)
        tl.add(f"engine{e}", Phase.generate, t0 + engine_sync, wait_end)
    tl.add("driver", Phase.reward, wait_end, wait_end + reward)
    train_end = wait_end + reward + train
    tl.add("learner0", Phase.train, wait_end + reward, train_end)
    tl.add("learner0", Phase.sync, train_end, train_end + learner_sync)
    return {"step": step, "response_tokens": tokens, "timeline": tl.to_dict()["spans"],
            "step_s": train_end + learner_sync - t0, "reward_mean": 0.5, "reward_std": 0.1}


def series(pairs: list[tuple[float, float]], **kw) -> list[dict]:
    out, t = [], 1000.0
    for i, (gen, train) in enumerate(pairs):
        r = on_policy_record(i, gen, train, t0=t, **kw)
        out.append(r)
        t += r["step_s"] + 0.001
    return out


def test_generation_bound_step():
    m = measure_record(on_policy_record(0, gen=0.90, train=0.10))
    v = assess(m, BalanceContext(num_engines=1, async_steps=0))
    assert v.kind == Kind.generation_bound.value
    window = 0.01 + 0.90 + 0.01 + 0.10 + 0.01
    assert v.learner_wait_s == pytest.approx(0.91)
    assert v.learner_wait_frac == pytest.approx(0.91 / window)
    assert v.engine_idle_s == pytest.approx(window - 0.91)
    assert v.ratio == pytest.approx(0.91 / (window - 0.91))
    assert v.gen_tokens_per_s == pytest.approx(1000 / 0.91)
    assert v.required_tokens_per_s == pytest.approx(1000 / (window - 0.91))
    assert v.sync_s == pytest.approx(0.02)
    # ratio 7.6 with one engine: 8 engines keep up; on-policy, so overlapping is the other fix
    assert "the learner waited 88% of the step" in v.advice
    assert "add 7 engines (engine.num_engines=8)" in v.advice
    assert "algo.async_steps to 1" in v.advice


def test_training_bound_step():
    v = assess(measure_record(on_policy_record(0, gen=0.10, train=0.90, engines=4)), BalanceContext(num_engines=4))
    assert v.kind == Kind.training_bound.value
    assert v.engine_idle_frac > 0.8
    assert "engines sat idle" in v.advice
    # producer 0.11 s against consumer 0.92 s: one engine of the four would keep up
    assert "engine.num_engines=1 would keep up" in v.advice


def test_a_training_bound_split_run_is_told_to_train_on_every_gpu():
    m = measure_record(on_policy_record(0, gen=0.10, train=0.90, engines=2))
    split = BalanceContext(num_engines=2, device="cuda", engine_gpus=2, learner_gpus=2, hybrid=True)
    assert "hardware.colocated=true: a learner rank beside the engines on each of the 4 GPUs, not 2" in \
        assess(m, split).advice
    assert "hardware.colocated" not in assess(m, dataclasses.replace(split, hybrid=False)).advice
    # the plan says where it could: engines of their own that can share a GPU (vLLM), not hf engines or CPU runs
    from rlgen.config.compose import compose_run_config
    from rlgen.metrics.balance_context import context_from_plan
    from rlgen.plan import build_plan

    def plan_of(*overrides):
        return build_plan(compose_run_config(list(overrides)))

    assert context_from_plan(plan_of("engine=vllm", "hardware=4xh100", "hardware.colocated=false")).hybrid
    assert not context_from_plan(plan_of("engine=vllm", "hardware=4xh100", "hardware.colocated=true")).hybrid
    assert not context_from_plan(plan_of("hardware=cpu")).hybrid


def test_balanced_step_suggests_overlap_only_when_on_policy():
    m = measure_record(on_policy_record(0, gen=0.50, train=0.48))
    assert assess(m).kind == Kind.balanced.value
    assert "async_steps to 1" in assess(m, BalanceContext(async_steps=0)).advice
    assert "async_steps" not in assess(m, BalanceContext(async_steps=1)).advice


def test_dead_band_is_symmetric():
    assert classify(1.14) == Kind.balanced
    assert classify(1.16) == Kind.generation_bound
    assert classify(1 / 1.14) == Kind.balanced
    assert classify(1 / 1.16) == Kind.training_bound
    assert classify(2.0, band=1.5) == Kind.balanced


def test_noisy_step_does_not_flip_rolling_verdict():
    recs = series([(0.9, 0.1)] * 4 + [(0.1, 0.9)] + [(0.9, 0.1)] * 3)
    tracker = BalanceTracker(BalanceContext(num_engines=1), hold=3)
    verdicts = [tracker.update(r) for r in recs]
    assert [v.kind for v in verdicts] == [Kind.generation_bound.value] * 8
    assert verdicts[4].step_kind == Kind.training_bound.value


def test_sustained_change_flips_after_hold_steps():
    recs = series([(0.9, 0.1)] * 3 + [(0.1, 0.9)] * 4)
    tracker = BalanceTracker(BalanceContext(num_engines=1), hold=3)
    kinds = [tracker.update(r).kind for r in recs]
    g, t = Kind.generation_bound.value, Kind.training_bound.value
    assert kinds == [g, g, g, g, g, t, t]  # the third training-bound step in a row flips it


def test_interrupted_candidate_starts_counting_again():
    recs = series([(0.9, 0.1)] * 2 + [(0.1, 0.9)] * 2 + [(0.9, 0.1)] + [(0.1, 0.9)] * 2)
    tracker = BalanceTracker(hold=3)
    kinds = [tracker.update(r).kind for r in recs]
    assert set(kinds) == {Kind.generation_bound.value}


def test_warmup_step_is_reported_but_does_not_set_the_rolling_kind():
    recs = series([(0.1, 0.9)] + [(0.9, 0.1)] * 3)  # a slow first train step, then generation-bound
    tracker = BalanceTracker(warmup=1, hold=3)
    kinds = [tracker.update(r).kind for r in recs]
    assert kinds[0] == Kind.training_bound.value
    assert kinds[1:] == [Kind.generation_bound.value] * 3


def test_rolling_numbers_average_the_window():
    recs = series([(0.9, 0.1), (0.5, 0.1), (0.7, 0.1)])
    tracker = BalanceTracker(warmup=0, window=2)
    v = [tracker.update(r) for r in recs][-1]
    assert v.steps == 2
    assert v.learner_wait_s == pytest.approx((0.51 + 0.71) / 2)


def test_run_summary_uses_means_past_warmup():
    recs = series([(5.0, 0.1)] + [(0.1, 0.9)] * 4 + [(3.0, 0.1)])
    v = summarize(recs)
    # the mean past warm-up: producer (4 x 0.11 + 3.01) / 5 = 0.69 s against consumer (4 x 0.92 + 0.12) / 5 = 0.76 s
    # (the median, 0.11 s against 0.92 s, said training-bound; with the warm-up step, generation-bound)
    assert v.producer_s == pytest.approx((4 * 0.11 + 3.01) / 5)
    assert v.consumer_s == pytest.approx((4 * 0.92 + 0.12) / 5)
    assert v.kind == Kind.balanced.value
    assert (v.steps, v.first_step, v.step) == (5, 1, 5)
    assert summarize([]) is None


def test_async_engine_busy_counted_per_batch():
    """With async_steps=1 the step's generation ran during the previous step's training (before its window)."""
    tl = StepTimeline(3)
    tl.add("engine0", Phase.generate, 9.0, 9.4)  # ran while step 2 trained
    tl.add("engine0", Phase.sync, 9.4, 9.45)
    tl.add("learner0", Phase.wait, 10.0, 10.01)
    tl.add("driver", Phase.reward, 10.01, 10.02)
    tl.add("learner0", Phase.train, 10.02, 10.92)
    tl.add("learner0", Phase.sync, 10.92, 11.0)
    m = measure(tl.spans, tokens=500, step=3)
    assert m.window_s == pytest.approx(1.0)
    assert m.producer_s == pytest.approx(0.45)
    assert m.engine_idle_s == pytest.approx(0.55)
    assert m.learner_wait_s == pytest.approx(0.01)
    assert assess(m, BalanceContext(async_steps=1)).kind == Kind.training_bound.value


def test_engine_without_spans_is_idle_all_step():
    rec = on_policy_record(0, gen=0.5, train=0.5, engines=1)
    m = measure_record(rec, num_engines=2)
    assert m.num_engines == 2
    assert m.engine_idle_s == pytest.approx(((m.window_s - 0.51) + m.window_s) / 2)


def test_no_loop_spans_is_an_error():
    with pytest.raises(ValueError, match="no learner or driver spans"):
        measure([{"actor": "engine0", "phase": "generate", "start": 0.0, "end": 1.0}], tokens=1)


def test_verdict_dict_is_json_even_when_learner_took_no_time():
    m = StepBalance(0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 10, 1)
    d = assess(m).to_dict()
    assert d["kind"] == Kind.generation_bound.value
    json.dumps(d, allow_nan=False)


def test_context_from_plan():
    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan

    plan = build_plan(compose_run_config(["engine=vllm_tp2", "hardware=8xh100", "algo.async_steps=2", "hardware.colocated=false", "hardware.engine_gpus=4", "hardware.learner_gpus=4"]))
    ctx = context_from_plan(plan)
    assert ctx == context_from_plan(json.loads(plan.to_json()))
    assert (ctx.num_engines, ctx.tensor_parallel_size, ctx.async_steps, ctx.device) == (2, 2, 2, "cuda")
    v = assess(measure_record(on_policy_record(0, gen=0.9, train=0.1, engines=2)), ctx)
    # 8 GPUs, all in use: GPUs move from the learners to the engines, and more engines only with more GPUs
    assert "move 2 GPUs from the learners to the engines (hardware.engine_gpus=6, hardware.learner_gpus=2" in v.advice
    assert "with more GPUs: hardware=2x8xh100 (engine.num_engines=16, 32 engine GPUs)" in v.advice
    assert "tensor_parallel_size" in v.advice
    assert "async_steps" not in v.advice  # already running ahead


@pytest.mark.parametrize("gen, train", [(0.1, 0.9), (0.9, 0.1), (0.5, 0.5)])
def test_cpu_runs_stay_on_policy_so_the_advice_never_asks_to_run_ahead(gen, train):
    """The plan keeps CPU runs on-policy (README); the advice does not contradict it, while a vLLM run on GPUs
    that the config kept on-policy is still told to run one step ahead."""
    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan

    record = on_policy_record(0, gen=gen, train=train)
    cpu = build_plan(compose_run_config([]))
    assert cpu.device == "cpu" and cpu.async_steps == 0
    for ctx in (context_from_plan(cpu), context_from_plan(json.loads(cpu.to_json()))):
        assert "async_steps" not in assess(measure_record(record), ctx).advice
    gpu = build_plan(compose_run_config(["engine=vllm", "hardware=8xh100", "algo.async_steps=0"]))
    assert "raise algo.async_steps to 1" in assess(measure_record(record), context_from_plan(gpu)).advice


def test_far_off_balance_does_not_count_out_absurd_engine_numbers():
    v = assess(measure_record(on_policy_record(0, gen=3.0, train=0.02)), BalanceContext(num_engines=2, device="cuda"))
    assert v.kind == Kind.generation_bound.value
    assert "add engines (it would take over 16x the 2 there are)" in v.advice
    assert "engine.num_engines=" not in v.advice


def test_learner_ranks_waiting_side_by_side_count_once():
    rec = on_policy_record(0, gen=0.6, train=0.2)
    twin = [dict(s, actor="learner1") for s in rec["timeline"] if s["actor"] == "learner0"]
    one, two = measure_record(rec), measure_record({**rec, "timeline": rec["timeline"] + twin})
    assert two.learner_wait_s == pytest.approx(one.learner_wait_s)
    assert two.sync_s == pytest.approx(one.sync_s)


ONE_GPU = ["1xh100", "1xh200"]


@pytest.mark.parametrize("hardware", ONE_GPU)
@pytest.mark.parametrize("model", ["qwen2_5_0_5b", "qwen2_5_1_5b", "small"])
@pytest.mark.parametrize("async_steps", [0, 1])
@pytest.mark.parametrize("per_gpu", [1, None])  # None: the plan's default, two engines per GPU at these sizes
def test_one_gpu_advice_asks_for_more_gpus_only_in_its_with_more_gpus_clause(hardware, model, async_steps, per_gpu):
    import re

    from rlgen.config.compose import compose_run_config, group_options
    from rlgen.plan import build_plan

    given = [f"engine.engines_per_gpu={per_gpu}"] if per_gpu else []
    plan = build_plan(compose_run_config(["engine=vllm", f"hardware={hardware}", f"model={model}",
                                          f"algo.async_steps={async_steps}", *given]))
    ctx = context_from_plan(plan)
    for gen, train in ((0.9, 0.1), (0.6, 0.4), (0.3, 0.2), (0.95, 0.01), (0.1, 0.9), (0.2, 0.6)):
        advice = assess(measure_record(on_policy_record(0, gen=gen, train=train, engines=1)), ctx).advice
        head, _, more = advice.partition("with more GPUs:")
        # no engine GPUs, learner GPUs, idle GPUs or GPUs moved between them on a one-GPU host
        assert not re.search(r"(engine|learner|idle) GPUs|more GPUs|GPUs from|GPUs to", head), advice
        assert all(int(k) <= 1 for k in re.findall(r"engine\.num_engines=(\d+)", head)), advice
        assert "hardware=" not in head, advice
        if more:
            preset = re.match(r" hardware=(\S+) ", more).group(1)
            assert preset in group_options("hardware") and preset not in ONE_GPU
        # never more than two engines per GPU: three generated slower than two (docs/benchmarks.md)
        assert not re.search(r"engines_per_gpu=[3-9]", advice), advice
        if gen / train > 1.5:  # generation-bound: the change this GPU can take is named
            assert "with more GPUs: hardware=" in advice
            if per_gpu == 1:
                assert "engine.engines_per_gpu=2" in head, advice
            else:  # two already: a shorter response is what is left on this GPU
                assert plan.config.engine.engines_per_gpu == 2 and "algo.max_new_tokens" in head, advice


def test_an_environment_that_takes_most_of_the_engines_time_is_named_as_the_bottleneck():
    def step(env_share: float) -> dict:
        tl = StepTimeline(0)
        tl.add("learner0", Phase.wait, 1000.0, 1001.0)
        tl.add("engine0", Phase.generate, 1000.0, 1000.0 + (1 - env_share))  # turns, then environment calls
        tl.add("engine0", Phase.env, 1000.0 + (1 - env_share), 1001.0)
        tl.add("learner0", Phase.train, 1001.0, 1001.1)
        return {"step": 0, "response_tokens": 100, "timeline": tl.to_dict()["spans"]}

    slow = measure_record(step(0.6))
    assert slow.env_s == pytest.approx(0.6) and slow.producer_s == pytest.approx(1.0)  # waiting on it is engine work
    advice = assess(slow, BalanceContext(num_engines=1)).advice
    assert "60% of the engines' time is their environment's" in advice
    assert "raise task.env_workers (the environment is the bottleneck)" in advice
    assert "environment" not in assess(measure_record(step(0.1)), BalanceContext(num_engines=1)).advice


def test_generation_bound_episodes_one_step_ahead_are_told_to_launch_two_ahead():
    tl = StepTimeline(0)
    tl.add("learner0", Phase.wait, 1000.0, 1001.0)  # the learner waits for the batch's last episodes
    tl.add("engine0", Phase.generate, 1000.0, 1001.0)
    tl.add("learner0", Phase.train, 1001.0, 1001.2)
    m = measure_record({"step": 0, "response_tokens": 100, "timeline": tl.to_dict()["spans"]})
    advice = assess(m, BalanceContext(num_engines=1, async_steps=1, episodes=True)).advice
    assert advice.startswith("generation-bound") and "raise algo.async_steps to 2" in advice
    assert "async_steps to 2" not in assess(m, BalanceContext(num_engines=1, async_steps=1)).advice  # single-turn
    assert "async_steps to 2" not in assess(m, BalanceContext(num_engines=1, async_steps=2, episodes=True)).advice
    on_cpu = BalanceContext(num_engines=1, async_steps=1, episodes=True, runs_ahead=False)
    assert "async_steps to 2" not in assess(m, on_cpu).advice


def test_the_context_knows_a_multi_turn_task_from_the_plan():
    assert context_from_plan({"async_steps": 2, "config": {"task": {"kind": "env"}}}).episodes
    assert not context_from_plan({"async_steps": 1, "config": {"task": {"kind": "arith"}}}).episodes
    assert not context_from_plan({"async_steps": 1}).episodes


def test_a_weight_update_whose_sides_overlap_counts_its_wall_time_once():
    # NCCL: the learner's broadcast and both engines' receives run side by side for 0.2 s; the union is 0.25 s
    rec = on_policy_record(0, gen=0.6, train=0.2, engine_sync=0.0, learner_sync=0.0)
    end = max(s["end"] for s in rec["timeline"])
    update = [{"actor": a, "phase": "sync", "start": end + lag, "end": end + lag + 0.2}
              for a, lag in (("learner0", 0.0), ("engine0", 0.02), ("engine1", 0.05))]
    m = measure_record({**rec, "timeline": rec["timeline"] + update})
    assert m.sync_s == pytest.approx(0.25)
    tl = StepTimeline(0)
    for s in update:
        tl.add(s["actor"], Phase.sync, s["start"], s["end"])
    assert tl.covered(Phase.sync) == pytest.approx(0.25)
    assert tl.total(Phase.sync) == pytest.approx(0.6)  # what adding them up would have said


def test_a_long_generation_tail_gets_partial_rollouts_advised_unless_they_are_on():
    from rlgen.metrics.balance import BalanceContext, Kind, StepBalance, advise

    # generation-bound (4 s generating against 1 s training); the learner waited 2.5 s of the 4 s step for the tail
    # of the last responses, with nothing generating beside it
    m = StepBalance(0, 4.0, 3.0, 4.0, 1.0, 4.0, 0.0, 0.0, 1000, 1, tail_s=2.5, tail_filled=0.0, tail_wait_s=2.5)
    text = advise(Kind.generation_bound, m, BalanceContext(async_steps=1))
    assert "waits 2.5 s a step for the generation tail" in text and "algo.partial_rollouts=0.25" in text
    assert "carrying the tail would cut the mean step by about 62%" in text
    assert "partial_rollouts" not in advise(Kind.generation_bound, m, BalanceContext(async_steps=1, partial=True))
    short = dataclasses.replace(m, tail_s=0.5, tail_wait_s=0.25)  # 6% of the step: not worth carrying
    assert "partial_rollouts" not in advise(Kind.generation_bound, short, BalanceContext(async_steps=1))
