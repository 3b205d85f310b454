"""The headroom of the disk checks follows the run: 5% of what it writes plus what its own small files take
(metrics lines, status, logs, plan.json, the PNG reports), not a fixed 64 MiB."""

from __future__ import annotations

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.plan.checks.disk_room import OnDisk, needed_with_headroom, room_problems, run_dir_bytes

MIB = 2**20


def _plan(*overrides: str):
    return build_plan(compose_run_config(list(overrides)))


def _least_free(plan) -> int:
    """The fewest free bytes under which the run directory's disk is refused (a bisection over the probe)."""
    lo, hi = 0, 10 * plan.disk.run_dir_bytes + 10**9
    while lo < hi:
        mid = (lo + hi) // 2
        if room_problems(plan, "/nonexistent/run", built=True, free_bytes=lambda _p, n=mid: n):
            lo = mid + 1
        else:
            hi = mid
    return lo


def test_the_default_cpu_run_asks_for_a_few_mb_of_headroom_not_64_mib():
    plan = _plan()  # steps=150, model=tiny: three checkpoints of about 1 MB at once
    writes = run_dir_bytes(plan, OnDisk())
    assert writes < 4 * MIB
    headroom = _least_free(plan) - writes
    assert 1 * MIB < headroom < 16 * MIB  # its metrics, logs and reports, well under 64 MiB
    assert headroom >= plan.config.steps * 4 * 2**10  # a few KB a step at the least
    longer = _plan("steps=3000")
    assert _least_free(longer) - run_dir_bytes(longer, OnDisk()) > headroom  # more steps, more lines


def test_a_big_models_headroom_is_still_five_percent():
    plan = _plan("engine=vllm", "hardware=2xh200", "model=qwen2_5_7b", "steps=3", "checkpoint.every=0")
    writes = run_dir_bytes(plan, OnDisk())
    assert _least_free(plan) - writes == pytest.approx(0.05 * writes, rel=0.01)  # its small files are a rounding
    assert needed_with_headroom(writes, plan.disk.small_bytes) == _least_free(plan)
