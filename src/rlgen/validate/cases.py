"""The cases of `rlgen validate`: heterogeneous request batches drawn by hypothesis."""

from __future__ import annotations

from dataclasses import dataclass

from rlgen.config import ValidateConfig


@dataclass(frozen=True)
class DrawnRequest:
    prompt_ids: tuple[int, ...]
    n: int
    temperature: float
    max_new_tokens: int


def prompt_length(v: ValidateConfig) -> int:
    """The prompt tokens of every request where validate.length is set (0: hypothesis draws them)."""
    return max(v.length - v.max_new_tokens, 1) if v.length > 0 else 0


def draw_cases(v: ValidateConfig, vocab_size: int, special_ids: set[int]) -> list[list[DrawnRequest]]:
    """v.cases batches drawn by hypothesis (its generate phase, seeded by v.seed: the same cases every run).
    With validate.length, each prompt's tokens come from a generator seeded by what hypothesis draws (a list of
    that many tokens is past what hypothesis draws itself)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hyp_seed
    from hypothesis import strategies as st

    if vocab_size <= len(special_ids):
        raise ValueError(f"a vocabulary of {vocab_size} tokens has no ordinary token to build prompts from.")
    token = st.integers(0, vocab_size - 1).filter(lambda t: t not in special_ids)
    ordinary = [t for t in range(vocab_size) if t not in special_ids]
    long = prompt_length(v)
    prompts = (st.integers(0, 2**31 - 1).map(lambda s: _long_prompt(s, long, ordinary)) if long else
               st.lists(token, min_size=1, max_size=max(v.max_prompt_tokens, 1)).map(tuple))
    request = st.builds(
        DrawnRequest,
        prompt_ids=prompts,
        n=st.integers(1, max(v.max_n, 1)),
        temperature=st.sampled_from([float(t) for t in v.temperatures]),
        max_new_tokens=st.integers(1, max(v.max_new_tokens, 1)),
    )
    cases: list[list[DrawnRequest]] = []

    @hyp_seed(v.seed)
    @settings(
        max_examples=v.cases,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(request, min_size=1, max_size=max(v.max_requests, 1)))
    def collect(case: list[DrawnRequest]) -> None:
        cases.append(case)

    collect()
    return cases[: v.cases]


def _long_prompt(seed: int, tokens: int, ordinary: list[int]) -> tuple[int, ...]:
    import random

    rng = random.Random(seed)
    return tuple(rng.choice(ordinary) for _ in range(tokens))


__all__ = ["DrawnRequest", "draw_cases", "prompt_length"]
