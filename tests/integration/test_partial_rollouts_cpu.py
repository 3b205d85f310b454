"""Partial rollouts on a local Ray cluster on CPU, on the default engine: every group carried into a step's
generation gets on there (its continuations start first), so none is carried on with no new token."""

from __future__ import annotations

import pytest
from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import build_plan
from rlgen.runtime.run import run_training

pytestmark = pytest.mark.usefixtures("module_ray")


def test_no_carried_group_is_left_without_new_tokens(tmp_path):
    cfg = compose_run_config(["progress=false", "checkpoint.every=0", "steps=5", "algo.async_steps=0",
                              "algo.partial_rollouts=0.25", "algo.partial_max_steps=4"])
    run_training(build_plan(cfg), tmp_path, Console(quiet=True))
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(records) == 5
    assert sum(r["partial/carried"] for r in records[:-1]) >= 1  # groups were cut short and carried
    assert all(r["partial/stalled"] == 0 for r in records)
    # the step after one that cut groups short finishes them (an engine runs the carried groups first)
    assert all(now["partial/finished_carried"] >= 1 for was, now in zip(records, records[1:]) if was["partial/carried"])
