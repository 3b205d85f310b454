"""``reasoning_gym``: reasoning-gym's procedural datasets by name, as single-turn tasks (``task=reasoning_gym
task.env_args.dataset=<name>``, and the dataset's own settings in ``task.env_args.config``).

The prompts are the dataset's questions, drawn by index; the episode is one turn, scored by the dataset's own
``score_answer`` on the whole entry (its metadata too), so every dataset is judged as reasoning-gym judges it. The
answer is what the policy put inside ``<answer>...</answer>`` when it used the tags, else its whole reply. Needs
the ``reasoning`` extra (``pip install 'rlgen[reasoning]'``); nothing is downloaded."""

from __future__ import annotations

import difflib
import random
from typing import Any

from rlgen.tasks.base import Prompt, TaskDataError
from rlgen.tasks.envs import Step, register_env

SIZE = 1_000_000  # indices drawn from; items are made on access, from (the dataset's seed + index)
ANSWER_TAGS = "Give the final answer inside <answer></answer>."


def _library() -> Any:
    try:
        import reasoning_gym
    except ImportError as err:
        raise TaskDataError("task.env=reasoning_gym needs reasoning-gym; install it with "
                            "pip install 'rlgen[reasoning]'.") from err
    return reasoning_gym


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


@register_env("reasoning_gym")
class ReasoningGymEnv:
    """One dataset of reasoning-gym; ``config`` are the dataset's own settings (its config class's fields, e.g.
    ``max_terms`` for chain_sum), ``seed`` its seed, ``instruct`` whether the question ends with the request for
    answer tags."""

    def __init__(self, dataset: str = "chain_sum", config: dict[str, Any] | None = None, seed: int = 0,
                 instruct: bool = True):
        rg = _library()
        names = dataset_names()
        if dataset not in names:
            near = difflib.get_close_matches(str(dataset), names, n=3)
            raise ValueError(f"reasoning-gym has no dataset {dataset!r}" +
                             (f"; did you mean {', '.join(near)}?" if near else f"; it has {len(names)}, e.g. "
                              "chain_sum, basic_arithmetic, leg_counting, gcd."))
        try:
            self.data = rg.create_dataset(dataset, **dict(config or {}), seed=int(seed), size=SIZE)
        except (TypeError, AssertionError) as err:
            raise ValueError(f"reasoning-gym's {dataset} does not take config={dict(config or {})}: {err}") from err
        self.name, self.instruct = dataset, bool(instruct)
        self.entry: dict[str, Any] | None = None

    def draw(self, rng: random.Random, n: int) -> list[Prompt]:
        out = []
        for _ in range(n):
            i = rng.randrange(SIZE)
            entry = self.data[i]
            text = " ".join(entry["question"].split())  # one line
            text = f"{text} {ANSWER_TAGS}" if self.instruct else text
            out.append(Prompt(text, str(entry["answer"]), source=f"{self.name}:{i}"))
        return out

    def reset(self, prompt: Prompt, seed: int) -> None:
        name, _, index = prompt.source.rpartition(":")
        if name != self.name or not index.isdigit():
            raise ValueError(f"the prompt {prompt.source!r} was not drawn from reasoning-gym's {self.name}")
        self.entry = self.data[int(index)]

    def step(self, action: str) -> Step:
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(action) if "<answer>" in action else action.strip()
        return Step(None, float(self.data.score_answer(answer, self.entry)), True)
