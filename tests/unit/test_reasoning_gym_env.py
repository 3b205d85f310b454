"""task=reasoning_gym: reasoning-gym's datasets by name, scored by the dataset's own score_answer on the entry
the prompt was drawn from; a wrong name or a missing package is one sentence."""

from __future__ import annotations

import random
import sys

import pytest

from rlgen.tasks.base import TaskDataError
from rlgen.tasks.envs import make_env

pytest.importorskip("reasoning_gym")


def test_each_prompt_is_scored_by_its_own_entry_with_or_without_answer_tags():
    env = make_env("reasoning_gym", {"dataset": "leg_counting", "config": {"max_animals": 3}, "instruct": True})
    prompts = env.draw(random.Random(0), 4)
    assert all(p.text.endswith("<answer></answer>.") and "\n" not in p.text for p in prompts)
    assert all(p.source.startswith("leg_counting:") for p in prompts)
    for p in prompts:
        env.reset(p, seed=1)
        right = env.step(f"I count. <answer>{p.answer}</answer>")
        assert right.done and right.reward == 1.0
        env.reset(p, seed=1)
        assert env.step(p.answer).reward == 1.0  # the bare reply is the answer when there are no tags
        env.reset(p, seed=1)
        assert env.step(f"<answer>{int(p.answer) + 1}</answer>").reward == 0.0


def test_the_same_index_is_the_same_question_in_another_process_copy():
    a = make_env("reasoning_gym", {"dataset": "chain_sum", "seed": 3})
    b = make_env("reasoning_gym", {"dataset": "chain_sum", "seed": 3})
    assert a.draw(random.Random(5), 8) == b.draw(random.Random(5), 8)
    other = make_env("reasoning_gym", {"dataset": "gcd"})
    with pytest.raises(ValueError, match="was not drawn from reasoning-gym's gcd"):
        other.reset(a.draw(random.Random(5), 1)[0], seed=0)


@pytest.mark.parametrize("args, said", [
    ({"dataset": "chain_summ"}, "has no dataset 'chain_summ'; did you mean chain_sum"),
    ({"dataset": "chain_sum", "config": {"max_terms": 1, "min_terms": 3}}, "does not take config="),
    ({"dataset": "chain_sum", "config": {"digits": 3}}, "does not take config="),
])
def test_a_wrong_dataset_or_setting_is_one_sentence(args, said):
    with pytest.raises(TaskDataError, match=said):
        make_env("reasoning_gym", args)


def test_without_the_package_the_sentence_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(TaskDataError, match=r"pip install 'rlgen\[reasoning\]'"):
        make_env("reasoning_gym", {"dataset": "chain_sum"})
