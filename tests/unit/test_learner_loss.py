"""A learner rank that dies or hangs, below the run: the gloo all-reduce raises CollectiveFailed on the surviving
rank (at once for a dead peer, after the timeout for a hung one); a step whose all-reduce failed leaves the
learner exactly at the last whole step; what decides whether a survivor may stand in for a lost rank; and the
sentences."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_torch_learner import make_batch
from transformers import GPT2Config, GPT2LMHeadModel

from helpers import algo_cfg
from rlgen.config import MonitorConfig
from rlgen.learners.group import CollectiveFailed
from rlgen.learners.torch import TorchLearner
from rlgen.runtime.cluster.waits import LearnerLost, _ranks_result
from rlgen.runtime.durability.learner_loss import fallback_sentence, stand_in_problem

SRC = str(Path(__file__).resolve().parents[2] / "src")
RANK = textwrap.dedent("""
    import json, os, sys, time
    import torch
    from rlgen.learners.collective import join_group, sum_over_ranks
    from rlgen.learners.group import CollectiveFailed
    rank, port, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    join_group(rank, 2, "127.0.0.1", port, 3.0, torch.device("cpu"))
    t = [torch.full((3,), float(rank + 1))]
    total = sum_over_ranks(t, 1.0, rank=rank, operation="step 0", timeout_s=3.0)
    print(json.dumps({"sum": total, "t": t[0].tolist()}), flush=True)
    if rank == 1:
        if how == "hang":
            time.sleep(60)
        os._exit(0)
    t0 = time.time()
    try:
        sum_over_ranks(t, 1.0, rank=rank, operation="the gradient all-reduce of step 1", timeout_s=3.0)
        print(json.dumps({"ok": True}), flush=True)
    except CollectiveFailed as err:
        print(json.dumps({"timed_out": err.timed_out, "message": str(err), "s": time.time() - t0}), flush=True)
""")


def _two_ranks(how: str) -> tuple[list[dict], list[dict]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": SRC}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(port), how], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
    try:
        out0 = procs[0].communicate(timeout=60)[0]
    finally:
        for p in procs:
            p.kill()
    out1 = procs[1].communicate(timeout=10)[0]
    return [json.loads(ln) for ln in out0.splitlines() if ln.startswith("{")], \
        [json.loads(ln) for ln in out1.splitlines() if ln.startswith("{")]


def test_the_all_reduce_sums_and_a_dead_peer_fails_it_at_once():
    rank0, rank1 = _two_ranks("exit")
    assert rank0[0] == {"sum": 2.0, "t": [3.0, 3.0, 3.0]} and rank1[0] == rank0[0]
    assert rank0[1]["timed_out"] is False and rank0[1]["s"] < 2.5
    assert rank0[1]["message"].startswith("learner rank 0: the gradient all-reduce of step 1 failed (")


def test_a_hung_peer_times_the_all_reduce_out():
    rank0, _ = _two_ranks("hang")
    assert rank0[1]["timed_out"] is True and 2.5 <= rank0[1]["s"] < 10
    assert rank0[1]["message"].startswith("learner rank 0: the gradient all-reduce of step 1 timed out (")


def test_collective_failed_crosses_processes_whole():
    err = pickle.loads(pickle.dumps(CollectiveFailed(1, "the gradient all-reduce of step 7", True, "gloo said so")))
    assert (err.rank, err.operation, err.timed_out) == (1, "the gradient all-reduce of step 7", True)
    assert str(err) == "learner rank 1: the gradient all-reduce of step 7 timed out (gloo said so)"


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A small GPT-2 (the learner turns its dropout off)."""
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                       bos_token_id=1, eos_token_id=1))
    path = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(path)
    return str(path)


def test_a_step_whose_all_reduce_failed_leaves_the_learner_at_the_last_whole_step(gpt2_dir, monkeypatch):
    learner = TorchLearner(gpt2_dir, algo_cfg(lr=1e-2), MonitorConfig(), seed=3)
    batch = make_batch(learner.model)
    learner.train_step(batch)  # one whole step: optimizer state exists
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    opt = learner.optimizer.state_dict()
    moments = {i: s["exp_avg"].clone() for i, s in opt["state"].items()}
    rng, calls, version = torch.get_rng_state(), learner.calls, learner.version

    def fail(step_index, denom):
        torch.rand(4)  # the step drew from the RNG before its all-reduce (as LoRA dropout does)
        raise CollectiveFailed(0, f"the gradient all-reduce of step {step_index}", False, "peer closed")

    learner.world_size = 2  # as a rank of two, whose peer is gone
    monkeypatch.setattr(learner, "_sum_gradients", fail)
    with pytest.raises(CollectiveFailed, match="step 1"):
        learner.train_step(batch)
    assert (learner.calls, learner.version, learner.skipped_steps) == (calls, version, 0)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in learner.model.state_dict().items())
    after = learner.optimizer.state_dict()["state"]
    assert all(torch.equal(moments[i], s["exp_avg"]) for i, s in after.items())
    assert all(p.grad is None for p in learner.params)


class _Rank:
    def __init__(self, held: dict):
        self.whole_step = SimpleNamespace(remote=lambda: held)


def _run(held: list[dict], *, step: int = 4, version: int = 4, recorded: dict | None = None) -> SimpleNamespace:
    learners = [_Rank(h) for h in held] + [_Rank({})]  # the last rank is the lost one
    waiter = SimpleNamespace(get=lambda refs, *args, **kwargs: list(refs))
    state = SimpleNamespace(step=step, version=version, rank_rng={1: (4, "abc")} if recorded is None else recorded)
    return SimpleNamespace(built=SimpleNamespace(learners=learners), services=SimpleNamespace(waiter=waiter),
                           state=state, cfg=SimpleNamespace(runtime=SimpleNamespace(hang_timeout_s=1.0)))


WHOLE = {"calls": 4, "version": 4, "rng_digest": "abc", "replicas": True}


@pytest.mark.parametrize(("held", "kwargs", "why"), [
    ([WHOLE], {}, None),
    ([], {}, "no learner rank survived to stand in for it"),
    ([{**WHOLE, "replicas": False}], {}, "the ranks' files differ (each holds its own part of the optimizer state)"),
    ([{**WHOLE, "calls": 5, "version": 5}], {}, "learner rank 0 holds 5 steps, not 4"),
    ([WHOLE], {"recorded": {}}, "learner rank 1's RNG state after step 3 is not known to this process"),
    ([WHOLE], {"recorded": {1: (3, "abc")}}, "learner rank 1's RNG state after step 3 is not known to this process"),
    ([{**WHOLE, "rng_digest": "def"}], {}, "the lost rank's RNG state differs from the surviving ranks'"),
])
def test_a_survivor_stands_in_only_for_a_replica_at_the_same_step_and_rng(held, kwargs, why):
    run = _run(held, **kwargs)
    lost = [len(run.built.learners) - 1]
    assert stand_in_problem(run, lost, list(range(len(held)))) == why


def test_the_fallback_sentences_name_the_checkpoint_or_say_there_is_none():
    what = "learner rank 1 on node 10.0.0.2 died during training step 7 (killed)"
    assert fallback_sentence(what, "no learner rank survived to stand in for it", "/r/checkpoints/step_000004", 7) == (
        f"{what}; no checkpoint of step 7 could be written (no learner rank survived to stand in for it), so the "
        "run continues from the last complete checkpoint, step_000004, with resume=auto (the steps after it run "
        "again).")
    assert fallback_sentence(what, "why", None, 7) == (
        f"{what}; no checkpoint of step 7 could be written (why) and none was written before, so the run starts "
        "again from step 0 (run the same command without resume=).")


def test_the_hang_timeout_reaches_the_learners_and_must_be_positive():
    from rlgen.config.compose import compose_run_config
    from rlgen.learners.registry import LEARNERS
    from rlgen.plan import PlanError, build_plan

    cfg = compose_run_config(["runtime.hang_timeout_s=45"])
    plan = build_plan(cfg)
    assert LEARNERS[plan.learner_kind].actor_kwargs(plan.config, plan)["hang_timeout_s"] == 45.0
    assert compose_run_config([]).runtime.hang_timeout_s == 300.0
    with pytest.raises(PlanError, match=r"runtime.hang_timeout_s=0.0 must be a positive number of seconds"):
        build_plan(compose_run_config(["runtime.hang_timeout_s=0"]))


def _collective(timed_out: bool) -> SimpleNamespace:
    """A rank's call that raised CollectiveFailed, as Ray hands it back (the exception as its cause)."""
    return SimpleNamespace(cause=CollectiveFailed(0, "the gradient all-reduce of step 7", timed_out, "gloo"))


def test_a_rank_still_running_after_its_peer_timed_out_is_named_with_the_operation():
    with pytest.raises(LearnerLost) as info:
        _ranks_result([None, None], [("collective", _collective(True)), ("pending", None)], "training step 7",
                      None, None, 60.0, [0, 1])
    assert str(info.value) == ("learner rank 1 did not finish the gradient all-reduce of step 7 within "
                               "runtime.hang_timeout_s=60")
    assert info.value.hung and info.value.ranks == [1]


def test_a_dead_rank_is_named_before_the_collective_it_broke():
    died = RuntimeError("The actor died unexpectedly before finishing this task.")
    with pytest.raises(LearnerLost) as info:
        _ranks_result([None, None], [("collective", _collective(False)), ("dead", died)], "training step 3",
                      None, None, 60.0, [0, 1])
    assert str(info.value) == ("learner rank 1 died during training step 3 (The actor died unexpectedly before "
                               "finishing this task.)")
    assert not info.value.hung and info.value.ranks == [1]
