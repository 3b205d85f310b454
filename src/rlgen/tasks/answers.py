"""Reference answers out of dataset solutions, and final answers out of completions. Pure Python.

GSM8K solutions end with "#### <answer>"; MATH solutions put it in \\boxed{...}. A completion's final answer
is its last \\boxed{...}, else what follows its last "####", else the whole text (the math checker then finds
the last expression in it).
"""

from __future__ import annotations

import re

from rlgen.config import AnswerFormat

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (braces nested), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start : i - 1].strip()
    return None


def after_hashes(text: str) -> str | None:
    """What follows the last "####" on its line (GSM8K), commas between digits removed, or None."""
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip().splitlines()
    return re.sub(r"(?<=\d),(?=\d{3})", "", tail[0].strip()) if tail else ""


def reference_answer(solution: str, fmt: AnswerFormat) -> str | None:
    """The answer a dataset row's solution gives, in the row's format; None when it holds none."""
    fmt = AnswerFormat(fmt)
    if fmt is AnswerFormat.gsm8k:
        return after_hashes(solution)
    if fmt is AnswerFormat.boxed:
        return last_boxed(solution)
    return solution.strip()


def final_answer(completion: str) -> str:
    """The part of a completion that states its answer: the last \\boxed{}, the text after the last "####",
    the words after "the answer is", or else the whole completion."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    hashed = after_hashes(completion)
    if hashed is not None:
        return hashed
    said = _ANSWER_IS.findall(completion)
    if said:
        return said[-1].strip().rstrip(".")
    return completion


def states_an_answer(completion: str) -> bool:
    """Whether the completion puts its answer in a \\boxed{} or after "####"."""
    return last_boxed(completion) is not None or (after_hashes(completion) or "") != ""
