"""The math reward on a table of answers that are the same number written differently (1) and answers that are
not (0); reference answers out of GSM8K and MATH solutions; the format reward; several rewards weighted."""

from __future__ import annotations

import pytest

from rlgen.config import AnswerFormat, TaskConfig
from rlgen.tasks.answers import final_answer, last_boxed, reference_answer
from rlgen.tasks.rewards import REWARDS, RewardSet

pytest.importorskip("math_verify")
math = REWARDS["math"]

EQUAL = [  # (reference answer, completion)
    ("0.5", "\\boxed{1/2}"),
    ("0.5", "#### 0.5"),
    ("0.5", "so the answer is \\boxed{\\frac{1}{2}}"),
    ("\\frac{1}{2}", "\\boxed{0.5}"),
    ("\\frac{1}{2}", "#### 1/2"),
    ("1/2", "\\boxed{\\dfrac{1}{2}}"),
    ("1/2", "\\boxed{\\tfrac12}"),
    ("72", "She sold 48 + 24 = 72 clips.\n#### 72"),
    ("72", "\\boxed{72}"),
    ("72", "\\boxed{72.0}"),
    ("72", "The answer is 72."),
    ("1000", "#### 1,000"),
    ("1,000", "\\boxed{1000}"),
    ("-3", "\\boxed{-3}"),
    ("-3", "#### -3"),
    ("0.25", "\\boxed{\\frac{1}{4}}"),
    ("25", "\\boxed{25.00}"),
    ("\\sqrt{2}", "\\boxed{2^{1/2}}"),
    ("\\sqrt{8}", "\\boxed{2\\sqrt{2}}"),
    ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}"),
    ("x+1", "\\boxed{1+x}"),
    ("2x", "\\boxed{x+x}"),
    ("\\frac{3}{4}", "\\boxed{0.75}"),
    ("3", "\\boxed{\\frac{6}{2}}"),
    ("\\pi", "\\boxed{\\pi}"),
    ("\\frac{\\pi}{2}", "\\boxed{\\pi/2}"),
    ("10", "we get $10$, so \\boxed{10}"),
    ("\\{1,2\\}", "\\boxed{\\{2,1\\}}"),
    ("5", "\\boxed{5} apples"),
    ("12", "After the steps, #### 12"),
    ("8", "2^3 = \\boxed{8}"),
    ("0.1", "\\boxed{\\frac{1}{10}}"),
]
NOT_EQUAL = [
    ("0.5", "\\boxed{0.6}"),
    ("72", "#### 27"),
    ("72", "\\boxed{71.9}"),
    ("3", "\\boxed{4}"),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}"),
    ("-3", "\\boxed{3}"),
    ("x+1", "\\boxed{x-1}"),
    ("\\sqrt{2}", "\\boxed{2}"),
    ("1000", "#### 100"),
    ("\\pi", "\\boxed{3.14}"),
    ("12", "I cannot tell."),
    ("5", ""),
    ("25", "\\boxed{}"),
]


def test_the_table_is_large_enough():
    assert len(EQUAL) + len(NOT_EQUAL) >= 40


@pytest.mark.parametrize(("answer", "completion"), EQUAL)
def test_equivalent_answers_score_one(answer, completion):
    assert math(completion, answer) == 1.0


@pytest.mark.parametrize(("answer", "completion"), NOT_EQUAL)
def test_different_answers_score_zero(answer, completion):
    assert math(completion, answer) == 0.0


@pytest.mark.parametrize(("solution", "fmt", "answer"), [
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", AnswerFormat.gsm8k, "72"),
    ("It costs 1,200 dollars.\n#### 1,200", AnswerFormat.gsm8k, "1200"),
    ("no answer here", AnswerFormat.gsm8k, None),
    ("so $x = \\boxed{\\frac{1}{2}}$.", AnswerFormat.boxed, "\\frac{1}{2}"),
    ("first \\boxed{1}, then \\boxed{\\{a, \\{b\\}\\}}", AnswerFormat.boxed, "\\{a, \\{b\\}\\}"),
    ("  42 ", AnswerFormat.plain, "42"),
])
def test_reference_answers_come_out_of_solutions(solution, fmt, answer):
    assert reference_answer(solution, fmt) == answer


def test_a_completions_final_answer_is_its_last_box_or_what_follows_hashes():
    assert final_answer("try \\boxed{1} then \\boxed{2}") == "2"
    assert final_answer("work...\n#### 3,000\nthanks") == "3000"
    assert final_answer("So the answer is 7.") == "7"
    assert last_boxed("\\boxed{unclosed") is None


def test_format_reward_and_weighted_rewards():
    fmt = REWARDS["format"]
    assert fmt("#### 4", "4") == 1.0 and fmt("\\boxed{4}", "4") == 1.0 and fmt("4", "4") == 0.0
    rs = RewardSet.from_config(TaskConfig(rewards={"math": 1.0, "format": 0.1}))
    assert rs.names == ["math", "format"]
    assert rs.score("#### 4", "4") == (pytest.approx(1.1), {"math": 1.0, "format": 1.0})
    assert rs.score("4", "4") == (pytest.approx(1.0), {"math": 1.0, "format": 0.0})
    assert rs.score("#### 5", "4") == (pytest.approx(0.1), {"math": 0.0, "format": 1.0})
    single = RewardSet.from_config(TaskConfig(reward="exact_match"))
    assert single.score("4", "4") == (1.0, {"exact_match": 1.0})
