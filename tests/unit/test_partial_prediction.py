"""`rlgen plan` predicts the step without and with partial rollouts where the run's lengths have a tail (RL-shaped:
max_new_tokens well above the response mean), says which it expects faster, and where partial rollouts are on and
predicted not to help, says so in one note."""

from __future__ import annotations

import functools
import io

import pytest
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.plan import prediction_generation as gen_model
from rlgen.plan.prediction import predict, print_prediction

SHAPED = ["engine=vllm", "model=qwen2_5_0_5b", "algo.max_new_tokens=2048", "task.response_length_mean=256",
          "engine.max_model_len=2112", "algo.prompts_per_step=64"]
ONE_GPU = [*SHAPED, "hardware=1xh200"]


@functools.cache
def _predict(*overrides: str):
    return predict(build_plan(compose_run_config(list(overrides))))


def _printed(p) -> str:
    buf = io.StringIO()
    print_prediction(p, Console(file=buf, width=300))
    return buf.getvalue()


def _no_gain_notes(p) -> list[str]:
    return [n for n in p.notes if "is predicted not to shorten the step" in n]


def test_a_decode_step_splits_into_a_fixed_part_and_a_part_a_sequence_through_both_measurements():
    s, low = gen_model.CALIBRATION_SHAPE, gen_model.STEP_CALIBRATION

    def step(k: int, ctx: float) -> float:
        roof = gen_model.step_time(k, ctx, s["params"], s["layers"], s["hidden"], s["kv_bytes_per_token"], 1,
                                   s["hbm_tbps"], s["bf16_tflops"])[2]
        return roof + gen_model.DECODE_STEP_CPU_S + k * gen_model.DECODE_TOKEN_CPU_S

    assert step(1024, 128 + 512 / 2) == pytest.approx(1024 / gen_model.CALIBRATION_TOKENS_PER_S, rel=1e-9)
    assert step(64, 64 + 256 / 2) == pytest.approx(low["step_s"], rel=1e-9)  # the 6 ms step of 64 sequences
    assert 2.0e-3 < gen_model.DECODE_STEP_CPU_S < 3.0e-3 and 44e-6 < gen_model.DECODE_TOKEN_CPU_S < 48e-6


def test_the_plan_gives_the_step_without_and_with_partial_rollouts_where_the_lengths_have_a_tail():
    off = _predict(*ONE_GPU)
    p = off.partial
    assert p is not None and p.tail and p.share == 0.25  # the share the balance advice names
    # the batch waits for its longest of 512 responses without them, for a group's 0.8 quantile with them
    assert p.longest_tokens > 6 * p.mean_tokens and p.awaited_tokens < 0.6 * p.longest_tokens
    assert off.step_s == p.step_s_without and off.gen_s == p.gen_s_without  # the run as configured: off
    assert p.step_s_with < 0.9 * p.step_s_without and p.faster
    assert p.gain == pytest.approx(1 - p.step_s_with / p.step_s_without)
    text = _printed(off)
    assert "step without / with partial rollouts" in text
    assert f"{p.step_s_without:.2f} s / {p.step_s_with:.2f} s: faster with algo.partial_rollouts=0.25, by about" in text
    on = _predict(*ONE_GPU, "algo.partial_rollouts=0.25")
    assert on.step_s == pytest.approx(p.step_s_with) and on.partial.step_s_without == pytest.approx(p.step_s_without)
    assert not _no_gain_notes(on)
    assert off.to_dict()["partial"]["step_s_with"] == p.step_s_with  # in rlgen plan --json


def test_partial_rollouts_on_and_predicted_not_to_help_say_so_in_one_note():
    # engines on 3 GPUs of their own run one step ahead; the learner on the 4th takes longer than either case's
    # generation, so the step waits on training and carrying the tail does not shorten it
    split = _predict(*SHAPED, "hardware=4xh200", "hardware.engine_gpus=3", "model=qwen2_5_1_5b",
                     "algo.async_steps=1", "task.max_prompt_tokens=64", "algo.partial_rollouts=0.25")
    p = split.partial
    assert p.tail and p.gen_s_with < 0.9 * p.gen_s_without and not p.faster
    (note,) = _no_gain_notes(split)
    assert note.startswith("algo.partial_rollouts=0.25 is predicted not to shorten the step here")
    assert "the step waits on training, not on the generation tail" in note
    assert "about the same (under 10% apart)" in _printed(split)
    # few sequences at a time: the batch's tokens take more decode steps than its longest response, so no one waits
    # on the tail
    waves = _predict(*ONE_GPU, "engine.max_num_seqs=32", "algo.partial_rollouts=0.25")
    (note,) = _no_gain_notes(waves)
    assert waves.partial.step_s_with == pytest.approx(waves.partial.step_s_without)
    assert "more decode steps for the batch's tokens at full concurrency than its longest response takes" in note
    # responses cut at 256 tokens for a mean of 250: the longest is not far above the mean, so there is no tail
    capped = _predict(*ONE_GPU, "algo.max_new_tokens=256", "task.response_length_mean=250",
                      "algo.partial_rollouts=0.25")
    assert not capped.partial.tail and "step without / with" not in _printed(capped)
    (note,) = _no_gain_notes(capped)
    assert "little tail to carry" in note
    # the same runs with partial rollouts off get no such note
    assert not _no_gain_notes(_predict(*ONE_GPU, "engine.max_num_seqs=32"))


def test_no_comparison_without_a_length_model():
    fixed = _predict("engine=vllm", "model=qwen2_5_0_5b", "hardware=1xh200", "algo.max_new_tokens=512",
                     "algo.partial_rollouts=0.25")
    assert fixed.partial is None and not _no_gain_notes(fixed)
    assert "partial rollouts" not in _printed(fixed)
