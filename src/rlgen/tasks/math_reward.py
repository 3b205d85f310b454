"""The math reward: 1 when the completion's final answer equals the reference as mathematics, checked with
math-verify (1/2, 0.5, \\frac{1}{2} and \\boxed{\\tfrac12} are one answer; so are 1,000 and 1000), else 0.

math-verify is imported on first use (``pip install 'rlgen[data]'``). Its own timeouts bound each parse and
comparison (they use SIGALRM, so they hold in a process's main thread: the driver, or a reward worker).
"""

from __future__ import annotations

import threading
from functools import lru_cache

from rlgen.tasks.answers import final_answer, states_an_answer

TIMEOUT_S = 5


@lru_cache(maxsize=1)
def _configs():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(), ExprExtractionConfig()]


def _parse(text: str) -> list:
    from math_verify import parse

    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    return parse(text, extraction_config=_configs(), parsing_timeout=timeout)


@lru_cache(maxsize=4096)
def _gold(answer: str) -> list:
    """The reference parsed: as LaTeX first ($...$ lets x+1 or \\sqrt{2} parse), then as a plain expression."""
    return _parse(f"${answer}$") or _parse(answer)


def math_equal(completion: str, answer: str) -> float:
    from math_verify import verify

    gold = _gold(answer.strip())
    if not gold:
        return 0.0
    pred = _parse(f"\\boxed{{{final_answer(completion)}}}") or _parse(completion)
    if not pred:
        return 0.0
    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0


def format_reward(completion: str, answer: str) -> float:
    """1 when the completion states its answer where a grader looks (\\boxed{} or ####), else 0."""
    return 1.0 if states_an_answer(completion) else 0.0
