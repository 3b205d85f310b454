"""rlgen: fast, correct rollout generation for RL training of LLMs."""

import time

__version__ = "0.1.0"
STARTED_AT = time.time()  # about when this process started: time to the first rollout counts from here
_LAUNCHES = [STARTED_AT, 0.0]  # when the current run was launched; how many runs this process has begun


def launched_at() -> float:
    """When the current run was launched: the process's start for its first run, the run's own start for each
    later one (the jobs of a multirun after the first), so every run's start-up clock begins at its own launch."""
    return _LAUNCHES[0]


def run_launched() -> None:
    """A run begins in this process: after the first, its start-up clock starts now."""
    if _LAUNCHES[1]:
        _LAUNCHES[0] = time.time()
    _LAUNCHES[1] += 1
