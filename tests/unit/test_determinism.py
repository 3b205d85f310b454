"""deterministic=true (rlgen.plan.determinism): vLLM engines get the batch-invariant environment and the plan says
so and what it costs; a card vLLM did not document it for, and a running server, are warned about; the learners
take torch's deterministic algorithms; a step's batch does not depend on the order completions arrived in."""

from __future__ import annotations

import random

import torch
from rich.console import Console

from helpers import algo_cfg, save_tiny_qwen2
from rlgen.config import MonitorConfig
from rlgen.config.compose import compose_run_config
from rlgen.learners.torch import TorchLearner
from rlgen.plan import build_plan
from rlgen.plan.determinism import INVARIANT_SEATS
from rlgen.plan.view import print_plan
from rlgen.runtime.rollouts.batch import build_batch
from rlgen.types import Completion

GPU = ["engine=vllm", "hardware=1xh200", "model=qwen2_5_0_5b"]


def _plan(*overrides):
    return build_plan(compose_run_config(list(overrides)))


def test_the_engines_get_vllms_batch_invariance_and_the_plan_says_so():
    on, off = _plan(*GPU, "deterministic=true"), _plan(*GPU)
    assert on.engine_env["VLLM_BATCH_INVARIANT"] == "1" and "VLLM_BATCH_INVARIANT" not in off.engine_env
    assert not any("deterministic" in w for w in on.warnings)
    console = Console(record=True, width=400)
    print_plan(on, console)
    out = console.export_text()
    assert ("on: vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1) on at most 255 sequences and 255 tokens"
            in out)
    assert "weights that change between flights only" in out and "18% of" in out


def test_a_deterministic_engine_steps_through_at_most_255_sequences_and_tokens():
    # vLLM 0.26's batch invariance holds up to 255 rows a step (tests/gpu/test_batch_invariance.py)
    from rlgen.engines.vllm.args import build_engine_args

    default, on = _plan(*GPU).config.engine, _plan(*GPU, "deterministic=true").config.engine
    assert default.max_num_seqs == 2048 and default.max_num_batched_tokens is None  # the vllm preset's
    assert on.max_num_seqs == on.max_num_batched_tokens == INVARIANT_SEATS == 255
    small = _plan(*GPU, "deterministic=true", "engine.max_num_seqs=64", "engine.max_num_batched_tokens=128")
    assert (small.config.engine.max_num_seqs, small.config.engine.max_num_batched_tokens) == (64, 128)
    assert _plan("deterministic=true").config.engine.max_num_seqs == 256  # the hf engine on CPU as it is
    # what vLLM is given: the cap, else rlgen's tuned budget
    assert build_engine_args("/m", on)["max_num_batched_tokens"] == 255
    assert build_engine_args("/m", default)["max_num_batched_tokens"] == 16384


def test_a_card_vllm_did_not_document_it_for_is_warned_about():
    plan = _plan("engine=vllm", "hardware=1xh100", "hardware/gpu=a100_80gb", "model=qwen2_5_0_5b",
                 "deterministic=true")
    assert any("compute capability 9.0" in w and "A100" in w for w in plan.warnings)


def test_the_learners_take_torchs_deterministic_algorithms(tmp_path):
    path = save_tiny_qwen2(tmp_path / "m")
    try:
        TorchLearner(path, algo_cfg(), MonitorConfig(), deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    assert _plan("deterministic=true").config.deterministic  # the CPU default plans it too (nothing to set)


def _completions(seed: int) -> list[Completion]:
    rng = random.Random(seed)
    return [Completion(group_id=g, prompt_ids=[5, 6, g + 3], token_ids=[rng.randrange(3, 30) for _ in range(4)],
                       logprobs=[-1.0] * 4, finish_reason="length", version=0) for g in range(3) for _ in range(4)]


def test_a_batch_does_not_depend_on_the_order_completions_arrived_in():
    comps = _completions(0)
    rewards = [float(i) for i in range(len(comps))]
    shuffled = list(zip(comps, rewards))
    random.Random(1).shuffle(shuffled)
    a = build_batch(comps, rewards, pad_id=0)
    b = build_batch([c for c, _ in shuffled], [r for _, r in shuffled], pad_id=0)
    for key in ("input_ids", "attention_mask", "response_mask", "engine_logprobs", "rewards", "group_ids"):
        assert torch.equal(getattr(a, key), getattr(b, key)), key
    assert a.group_ids.tolist() == sorted(a.group_ids.tolist())


def test_a_running_servers_engines_are_warned_about(monkeypatch):
    from rlgen.plan import count_params

    params, vocab = count_params(compose_run_config([]).model)
    info = {"model": "tiny", "params": params, "vocab_size": vocab, "data_parallel": 1, "tensor_parallel_size": 1,
            "max_model_len": 128, "engine_kind": "vllm"}
    monkeypatch.setattr("rlgen.engines.remote.plan.fetch_info", lambda *a, **k: info)
    plan = _plan("engine=remote", "engine.url=http://127.0.0.1:9", "deterministic=true")
    assert any("rlgen serve deterministic=true" in w for w in plan.warnings)


class _Flights:
    """The run's rollouts as _push sees them: flights ahead, each collected (its results in) or not."""

    def __init__(self, n: int, log: list):
        self.flights, self.log = [f"flight{i}" for i in range(n)], log

    def ahead(self):
        return self.flights[0] if self.flights else None

    def waiting(self):
        return list(self.flights)

    def collect(self, flight):
        self.log.append(("collect", flight))

    def queue_updates(self, pending):
        self.log.append(("queued", list(pending)))


def _push_with(deterministic: bool, ahead: int = 2):
    from types import SimpleNamespace

    from rlgen.runtime.step import sync
    from rlgen.sync.transports.base import PushResult
    from rlgen.types import Phase, StepTimeline

    log: list = []

    def push(version, in_flight):
        log.append(("push", version, in_flight))
        return PushResult(version)

    run = SimpleNamespace(cfg=SimpleNamespace(deterministic=deterministic),
                          state=SimpleNamespace(async_steps=1, version=3),
                          built=SimpleNamespace(rollouts=_Flights(ahead, log), transport=SimpleNamespace(push=push)))
    tl = StepTimeline(0)
    sync._push(run, tl)
    return log, [s for s in tl.spans if s.phase == Phase.wait]


def test_a_deterministic_run_changes_weights_between_flights_only():
    log, waits = _push_with(deterministic=True)
    # every flight ahead is in before the update, which then goes out as one between flights
    assert log[:3] == [("collect", "flight0"), ("collect", "flight1"), ("push", 3, False)]
    assert len(waits) == 1 and waits[0].actor == "learner0"
    log, waits = _push_with(deterministic=False)
    assert log[0] == ("push", 3, True) and not waits  # otherwise the update lands in flight
    log, _ = _push_with(deterministic=True, ahead=0)
    assert log[0] == ("push", 3, False)  # nothing ahead: nothing to wait for


def test_a_deterministic_run_refuses_partial_rollouts():
    from rlgen.plan import PlanError

    try:
        _plan(*GPU, "deterministic=true", "algo.partial_rollouts=0.25")
    except PlanError as err:
        assert "deterministic=true with algo.partial_rollouts=0.25" in str(err)
        assert "algo.partial_rollouts=0" in str(err)
    else:
        raise AssertionError("the plan took partial rollouts in a deterministic run")
