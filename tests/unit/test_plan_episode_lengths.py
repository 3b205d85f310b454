"""The plan sizes an episode's sequences (the learner's memory, engine.max_model_len) by the episode's bound, not
by one turn's: a multi-turn episode is its prompt plus task.max_total_tokens."""

from __future__ import annotations

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan import PlanError, build_plan
from rlgen.plan.memory import longest_sequence


def test_a_multi_turn_episode_is_sized_by_its_whole_and_a_single_turn_by_its_turn():
    many = compose_run_config(["task=chain", "task.max_total_tokens=40", "task.max_turns=3", "algo.max_new_tokens=4"])
    assert build_plan(many).batch.max_seq_len == many.task.max_prompt_tokens + 40
    one = compose_run_config(["task=chain", "task.max_total_tokens=40", "task.max_turns=1", "algo.max_new_tokens=4"])
    assert build_plan(one).batch.max_seq_len == one.task.max_prompt_tokens + 4
    # the learner's longest row, which a micro-batch must hold, is the episode's bound, not one turn's
    long = compose_run_config(["task=chain", "task.max_total_tokens=64", "algo.max_new_tokens=4"])
    assert longest_sequence(long) == long.task.max_prompt_tokens + 64
    with pytest.raises(PlanError, match="cannot hold the longest row"):
        build_plan(compose_run_config(["task=chain", "task.max_total_tokens=64", "algo.max_new_tokens=4",
                                       "algo.micro_batch_tokens=40"]))
