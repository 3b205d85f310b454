"""A new engine kind, advantage estimator and policy loss plug in through their registries alone: this file
registers a stand-in of each (no other file names them) and a CPU run on Ray uses them, end to end: the plan reads
the engine's spec, the run builds its actors from it, the driver takes the estimator's advantages and the learner
the loss."""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import pytest
import ray.cloudpickle
import torch
from rich.console import Console

from rlgen.algo.inputs import LossOutputs
from rlgen.algo.loss import aggregate
from rlgen.algo.registry import (
    register_advantage,
    register_policy_loss,
    unregister_advantage,
    unregister_policy_loss,
)
from rlgen.config.compose import compose_run_config
from rlgen.engines.hf.engine import HFEngine
from rlgen.engines.registry import EngineSpec, register_engine, unregister_engine
from rlgen.metrics.sink import read_jsonl
from rlgen.plan import Layout, build_plan
from rlgen.runtime.run import run_training

STEPS = 4
# The actors import this module's classes and functions; a module Ray's workers cannot import travels by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class NotingEngine(HFEngine):
    """The stand-in engine kind: the hf engine's generation, each call noted as a file in `marks`."""

    def __init__(self, *args, marks: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.marks = Path(marks)

    def generate(self, requests, version=None):
        (self.marks / f"generate-{self.name}-{self.calls}").touch()
        return super().generate(requests, version)


def mean_baseline(rewards: torch.Tensor, group_ids: torch.Tensor, algo, calls: list) -> torch.Tensor:
    """The stand-in algorithm's advantages: reward minus its group's mean (no std), as REINFORCE with a baseline."""
    calls.append(len(rewards))
    out = torch.zeros_like(rewards)
    for g in group_ids.unique():
        rows = group_ids == g
        out[rows] = rewards[rows] - rewards[rows].mean()
    return out


def plain_pg(inputs, algo, *, marks: str) -> LossOutputs:
    """The stand-in policy loss: -A * logp per token (no ratio, no clip), token mean; each call noted."""
    n = len(list(Path(marks).glob("loss-*")))
    (Path(marks) / f"loss-{n}").touch()
    loss = -aggregate(inputs.advantages.unsqueeze(-1) * inputs.logp, inputs.mask, algo.loss_agg, algo.max_new_tokens,
                      denominator=inputs.denominator)
    return LossOutputs(loss, {"ratio_mean": 1.0})


@pytest.fixture
def stand_ins(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    calls: list[int] = []
    register_engine(EngineSpec(kind="noting", actor=f"{__name__}:NotingEngine",
                               actor_kwargs=lambda cfg, transport, env: {"marks": str(marks)}))
    register_advantage("mean_baseline", functools.partial(mean_baseline, calls=calls))
    register_policy_loss("plain_pg", functools.partial(plain_pg, marks=str(marks)))
    yield marks, calls
    unregister_engine("noting")
    unregister_advantage("mean_baseline")
    unregister_policy_loss("plain_pg")


def test_a_registered_engine_kind_and_algorithm_run_on_cpu(stand_ins, tmp_path):
    marks, calls = stand_ins
    cfg = compose_run_config(["engine.kind=noting", "algo.advantage=mean_baseline", "algo.policy_loss=plain_pg",
                              f"steps={STEPS}", "progress=false",
                              "algo.prompts_per_step=4", "algo.samples_per_prompt=4", "checkpoint.every=0"])
    plan = build_plan(cfg)
    assert plan.engine_kind == "noting" and plan.layout is Layout.cpu and plan.config.algo.policy_loss == "plain_pg"
    summary = run_training(plan, tmp_path / "run", Console(quiet=True))

    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(STEPS))
    assert all(math.isfinite(r["loss"]) for r in records)
    assert records[-1]["version"] == STEPS  # every step's update was applied and pushed
    assert len(list(marks.glob("generate-engine0-*"))) >= STEPS  # the stand-in engine generated every step
    assert calls == [16] * STEPS  # the driver took the stand-in's advantages, once per step, for 4 x 4 rows
    assert len(list(marks.glob("loss-*"))) >= STEPS  # and the learner its loss
    assert summary["checkpoint_path"].endswith("step_000004")


def test_an_unregistered_kind_is_refused_with_the_kinds_there_are():
    from rlgen.plan import PlanError

    with pytest.raises(PlanError, match=r"engine.kind=noting is not an engine kind; choose one of: hf, remote, vllm"):
        build_plan(compose_run_config(["engine.kind=noting"]))
