"""Partial rollouts (algo.partial_rollouts): groups cut short are carried into the next step's generation and go
on from where they stopped, with their tokens, logprobs and policy versions; the engines end a call once enough
groups are done; the plan refuses what the option cannot do and says the staleness it allows."""

from __future__ import annotations

import pytest

from helpers import plan_problems, save_tiny_qwen2
from rlgen.config import EngineConfig
from rlgen.engines.hf.engine import HFEngine
from rlgen.runtime.rollouts.carry import CUT, Carried, continuations, extra_groups, quotas, resolve, stitch
from rlgen.tasks.base import Prompt
from rlgen.types import Completion, GenRequest, SamplingParams


def _c(gid, toks, reason="stop", version=0, changes=(), prompt=(1, 2)):
    return Completion(gid, list(prompt), list(toks), [-0.1 * (k + 1) for k in range(len(toks))], reason, version,
                      version_changes=list(changes))


def test_stitch_joins_tokens_logprobs_and_versions():
    part = _c(0, [5, 6, 7], CUT, version=3, changes=[(2, 4)])
    more = _c(0, [8, 9], "stop", version=5, changes=[(1, 6)], prompt=(1, 2, 5, 6, 7))
    got = stitch(part, more)
    assert got.token_ids == [5, 6, 7, 8, 9] and got.prompt_ids == [1, 2]
    assert got.logprobs == part.logprobs + more.logprobs
    assert got.finish_reason == "stop" and got.version == 3
    assert got.version_changes == [(2, 4), (3, 5), (4, 6)]
    same = stitch(_c(0, [5], CUT, version=2), _c(0, [6], "length", version=2))
    assert same.version_changes == [] and same.finish_reason == "length"  # no update between: no change


def test_continuations_go_on_from_each_cut_sample_with_what_is_left_of_the_budget():
    s = SamplingParams(n=3, max_new_tokens=10, seed=7)
    c = Carried(Prompt("q", "a"), [1, 2], [_c(0, [5, 6], CUT), _c(0, [4], "stop"), _c(0, [], CUT)], steps=1,
                source=0)
    reqs = continuations(c, 9, s, max_steps=2)
    assert [r.prompt_ids for r in reqs] == [(1, 2, 5, 6), (1, 2)]
    assert [r.sampling.max_new_tokens for r in reqs] == [8, 10] and {r.sampling.n for r in reqs} == {1}
    assert {r.group_id for r in reqs} == {9} and reqs[0].sampling.seed != reqs[1].sampling.seed
    assert not any(r.must_finish for r in reqs)
    assert all(r.must_finish for r in continuations(c, 9, s, max_steps=1))  # carried as often as it may be


def test_resolve_trains_the_groups_done_and_carries_the_others():
    prompts = [Prompt(f"p{g}", str(g)) for g in range(3)]
    ids = [[1, g] for g in range(3)]
    was = Carried(prompts[2], ids[2], [_c(2, [7], CUT, prompt=ids[2]), _c(2, [3], "stop", prompt=ids[2])], 1, 0)
    comps = [_c(0, [4], prompt=ids[0]), _c(0, [5], prompt=ids[0]),  # group 0 done
             _c(1, [6], prompt=ids[1]), _c(1, [6, 6], CUT, prompt=ids[1]),  # group 1 cut short
             _c(2, [8, 9], "length", prompt=[1, 2, 7])]  # group 2's continuation
    got = resolve(4, prompts, ids, {2: was}, comps)
    assert [c.group_id for c in got.completions] == [0, 0, 1, 1]  # groups 0 and 2, numbered in order
    assert got.prompts == [prompts[0], prompts[2]]
    assert got.completions[2].token_ids == [7, 8, 9] and got.completions[2].prompt_ids == [1, 2]
    assert got.completions[3].token_ids == [3]
    assert len(got.cut) == 1 and got.cut[0].prompt == prompts[1] and got.cut[0].steps == 1 and got.cut[0].source == 4
    assert got.metrics["partial/carried"] == 1 and got.metrics["partial/finished_carried"] == 1
    assert got.metrics["partial/oldest"] == 1 and got.metrics["partial/cut_tokens"] == 3
    with pytest.raises(ValueError, match="continuations"):
        resolve(4, prompts, ids, {2: was}, comps[:4])  # a continuation lost


def test_a_carried_group_round_trips_through_json():
    c = Carried(Prompt("q", "a", source="x:1"), [1, 2], [_c(0, [5, 6], CUT, changes=[(1, 2)])], 2, 5)
    back = Carried.from_json(c.to_json())
    assert back == c and back.samples[0].version_changes == [(1, 2)]


def test_extra_groups_and_quotas():
    assert extra_groups(8, 0.25, 0) == 2 and extra_groups(8, 0.25, 5) == 0 and extra_groups(8, 0.3, 1) == 2
    assert quotas([5, 5], 8) == [4, 4] and sum(quotas([4, 3, 3], 8)) >= 8 and quotas([0, 2], 1) == [0, 1]


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> HFEngine:
    path = save_tiny_qwen2(tmp_path_factory.mktemp("tiny"), vocab_size=24, eos_token_id=1, pad_token_id=0,
                           max_position_embeddings=64)
    return HFEngine(path, EngineConfig(dtype="float32", max_num_seqs=16), seed=0)


def _req(gid, n, new, must=False):
    return GenRequest((5, 6, gid + 2), SamplingParams(n=n, max_new_tokens=new, ignore_eos=True, seed=3), gid,
                      must_finish=must)


def test_hf_generate_some_cuts_the_rest_short_once_enough_groups_are_done(engine):
    out = engine.generate_some([_req(0, 2, 2), _req(1, 2, 30), _req(2, 1, 30)], enough=1).completions
    assert [c.finish_reason for c in out[:2]] == ["length", "length"]
    cut = out[2:]
    assert all(c.finish_reason == CUT and 0 < len(c.token_ids) < 30 for c in cut)
    assert all(len(c.logprobs) == len(c.token_ids) for c in cut)
    assert all(len(c.token_ids) <= 3 for c in cut)  # it stopped as the first group was done, after 2 tokens


def test_hf_generate_some_runs_a_must_finish_request_to_its_end(engine):
    out = engine.generate_some([_req(0, 1, 2), _req(1, 1, 25, must=True), _req(2, 1, 40)], enough=1).completions
    assert out[1].finish_reason == "length" and len(out[1].token_ids) == 25
    assert out[2].finish_reason == CUT and len(out[2].token_ids) < 40


def test_the_plan_refuses_what_partial_rollouts_cannot_do():
    assert any("algo.partial_rollouts=5" in p for p in plan_problems(["algo.partial_rollouts=5"]))
    both = plan_problems(["algo.partial_rollouts=0.25", "algo.dynamic_sampling=true"])
    assert any("algo.partial_rollouts and algo.dynamic_sampling" in p for p in both)
    assert any("algo.partial_max_steps" in p for p in plan_problems(["algo.partial_rollouts=0.25",
                                                                     "algo.partial_max_steps=0"]))
    assert any("algo.partial_max_steps" in p and "algo.partial_rollouts" in p
               for p in plan_problems(["algo.partial_max_steps=3"]))  # set while the feature is off
    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan

    assert build_plan(compose_run_config(["algo.partial_rollouts=0.25"])).config.algo.partial_rollouts == 0.25


def test_rlgen_plan_shows_the_staleness_partial_rollouts_allow():
    from rlgen.config.compose import compose_run_config
    from rlgen.plan.view import partial_line

    a = compose_run_config(["algo.partial_rollouts=0.25", "algo.partial_max_steps=2"]).algo
    line = partial_line(a, async_steps=1)
    assert "25% more groups" in line and "at most 2 steps" in line and "up to 5 behind" in line
    assert partial_line(compose_run_config([]).algo, 1).startswith("off")


class _FakeLLM:
    """AsyncLLM's generate() as the vllm engine's generate_some() drives it: a job's final output after `params`
    seconds; a cancelled job is recorded (vLLM aborts it)."""

    def __init__(self):
        self.cancelled: list[str] = []

    async def generate(self, prompt, params, request_id, lora_request=None):
        import asyncio

        try:
            await asyncio.sleep(params)
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise
        yield f"final {request_id}"


def test_vllm_generate_until_returns_once_enough_groups_are_done_and_reads_the_rest_before_cancelling():
    import asyncio

    from rlgen.engines.cut_short import Until
    from rlgen.engines.vllm.loop import generate_until

    llm = _FakeLLM()
    # group 0: two quick samples; group 1: one quick, one slow; group 2: slow, but must finish; group 3: slow
    jobs = [(None, d, f"r{k}", None) for k, d in enumerate([0.01, 0.02, 0.01, 5.0, 0.3, 5.0])]
    s = SamplingParams(n=1)
    requests = [GenRequest((1,), s, g, must_finish=g == 2) for g in (0, 0, 1, 1, 2, 3)]  # one sample a job
    read = []

    def running(rid):
        read.append(rid)
        return ([7], [-0.5])

    out = asyncio.run(asyncio.wait_for(generate_until(llm, jobs, list(range(6)), Until(requests, 1), running), 3.0))
    assert out[:3] == ["final r0", "final r1", "final r2"] and out[4] == "final r4"  # r4 had to finish
    assert out[3] == ([7], [-0.5]) and out[5] == ([7], [-0.5])
    assert sorted(read) == ["r3", "r5"] and sorted(llm.cancelled) == ["r3", "r5"]


def _flight_with_carried(carried, prompts=4, max_steps=1_000_000):
    """A partial flight of one engine, as the run builds it: the step's own prompts and the carried groups."""
    from types import SimpleNamespace

    from rlgen.config.compose import compose_run_config
    from rlgen.runtime.rollouts.batch import StepPrompts
    from rlgen.runtime.rollouts.generation import Rollouts

    cfg = compose_run_config(["algo.partial_rollouts=0.25", f"algo.prompts_per_step={prompts}",
                              f"algo.partial_max_steps={max_steps}"])
    rollouts = Rollouts.__new__(Rollouts)
    rollouts.cfg, rollouts.keeper = cfg, SimpleNamespace(engines=[None])
    sp = StepPrompts(3, [Prompt(f"p{g}", "a") for g in range(prompts)], [[5, 6, g + 2] for g in range(prompts)])
    sampling = SamplingParams(n=2, max_new_tokens=12, ignore_eos=True, seed=3)
    return rollouts._partial_flight(3, 0, sp, sampling, carried, extra=0)


def _carried(gid, steps, toks=(7, 8)):
    ids = [5, 6, 9 + gid]
    return Carried(Prompt(f"c{gid}", "a"), ids, [_c(0, toks, CUT, prompt=ids), _c(0, toks, CUT, prompt=ids)],
                   steps=steps, source=2)


def test_a_carried_groups_continuations_go_first_oldest_first():
    flight = _flight_with_carried([_carried(0, 1), _carried(1, 3)])
    shard = flight.shards[0]
    assert [r.group_id for r in shard[:4]] == [4, 4, 5, 5] and all(r.sampling.n == 1 for r in shard[:4])
    assert flight.carried[4].steps == 3 and flight.carried[5].steps == 1  # the oldest first


def test_a_carried_group_gets_tokens_although_the_steps_own_groups_are_enough(engine):
    flight = _flight_with_carried([_carried(0, 1)])
    out = engine.generate_some(flight.shards[0], flight.enough[0]).completions
    more = [c for c in out if c.group_id in flight.carried]
    assert len(more) == 2 and all(c.token_ids for c in more)  # not left behind with 0 new tokens


def test_the_plan_refuses_a_partial_max_steps_the_run_never_reaches():
    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan

    got = plan_problems(["steps=10", "algo.partial_rollouts=0.25", "algo.partial_max_steps=1000000"])
    assert any("algo.partial_max_steps=1000000" in p and "steps=10" in p and "at most 9" in p for p in got)
    assert build_plan(compose_run_config(["steps=10", "algo.partial_rollouts=0.25", "algo.partial_max_steps=9"]))
    assert build_plan(compose_run_config(["steps=1", "algo.partial_rollouts=0.25"]))  # the default, 1, always fits
