"""Multi-turn episodes inside an engine (rlgen.engines.episodes) against a stand-in engine: the context of each
turn is exactly the tokens sampled so far plus the environment's, byte for byte, also under a chat template that
rewrites earlier turns; the learner's batch holds those tokens with the environment's out of the loss; an
environment that raises, hangs, dies or answers wrongly ends only its own episode, with reward 0, and one that
hangs is killed, its thread free for the calls queued behind; each episode plays in a process of its own, reused
for a later episode; the bounds hold; and the same requests give the same episodes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

import pytest

from rlgen.engines.episodes import Episodes, EpisodeSpec, TurnTokens
from rlgen.generated import GenResult
from rlgen.models.build import build_tokenizer
from rlgen.runtime.rollouts.batch import build_batch
from rlgen.tasks.base import Prompt
from rlgen.types import Completion, GenRequest, SamplingParams

# Rewrites earlier turns as thinking models' templates do: an assistant turn that is not the last loses its
# "<think>...</think>" part when the conversation is rendered again.
REWRITING = ("{% for m in messages %}{{ m['role'][0] }}:{% if m['role'] == 'assistant' and not loop.last %}"
             "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}<eos>{% endfor %}"
             "{% if add_generation_prompt %}a:{% endif %}")
ENVS = Path(__file__).resolve().parents[1] / "envs"  # episode_envs: the environments these tests play


@pytest.fixture(autouse=True)
def envs_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))


class StandInEngine:
    """Samples "7" then "<think>ab</think>" then "<eos>" for any context (logprob -0.5 each) and records every
    request it gets."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def generate(self, requests):
        self.calls.append(requests)
        out = []
        for r in requests:
            assert r.episode is None
            ids = self.tok.encode("7<think>ab</think>", add_special_tokens=False)[: r.sampling.max_new_tokens - 1]
            ids = ids + [self.tok.eos_token_id]
            for _ in range(r.sampling.n):
                out.append(Completion(r.group_id, list(r.prompt_ids), list(ids), [-0.5] * len(ids), "stop", 3))
        return GenResult(completions=out, version=3)


@pytest.fixture
def tok():
    return build_tokenizer()


def requests(tok, env="episode_envs:EchoEnv", n=2, chat=False, prompts=("3+4=",), **spec):
    env_args = spec.pop("env_args", {})
    sampling = SamplingParams(n=n, temperature=1.0, max_new_tokens=32, stop_token_ids=(tok.eos_token_id,), seed=11)
    out = []
    for g, text in enumerate(prompts):
        ids = (tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
               if chat else tok.encode(text, add_special_tokens=False))
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        episode = EpisodeSpec(env=env, env_args=env_args, prompt=Prompt(text, "7"), chat=chat, **spec)
        out.append(GenRequest(tuple(ids), sampling, g, episode=episode))
    return out


def play(tok, reqs, engine=None, in_turns=True):
    engine = engine or StandInEngine(tok)
    comps, _ = Episodes(engine.generate, reqs, tok, in_turns=in_turns).run()
    return comps, engine


def test_each_turn_sees_exactly_the_sampled_tokens_and_the_environments(tok):
    comps, engine = play(tok, requests(tok, env_args={"turns": 3}))
    turn = tok.encode("7<think>ab</think>", add_special_tokens=False) + [tok.eos_token_id]
    env = [tok.encode(f"+{k}=", add_special_tokens=False) for k in (1, 2)]
    prompt = tok.encode("3+4=", add_special_tokens=False)
    assert len(comps) == 2 and len(engine.calls) == 3  # turn 1: one request of n=2; then one call per turn
    for c in comps:
        assert c.token_ids == turn + env[0] + turn + env[1] + turn
        assert c.loss_mask == [1] * len(turn) + [0] * 3 + [1] * len(turn) + [0] * 3 + [1] * len(turn)
        assert [lp for lp, m in zip(c.logprobs, c.loss_mask) if not m] == [0.0] * 6
        assert c.env_reward == 3.0 and c.turns == 3 and c.finish_reason == "stop" and c.env_error == ""
    # what the engine was asked to continue: the prompt, then its own tokens and the environment's, never re-encoded
    third = engine.calls[2][0]
    assert list(third.prompt_ids) == prompt + turn + env[0] + turn + env[1]


def test_a_template_that_rewrites_earlier_turns_does_not_change_the_tokens_trained_on(tok):
    tok.chat_template = REWRITING
    comps, engine = play(tok, requests(tok, chat=True, env_args={"turns": 2}))
    c = comps[0]
    turn = tok.encode("7<think>ab</think>", add_special_tokens=False) + [tok.eos_token_id]
    assert c.token_ids[: len(turn)] == turn
    assert tok.decode(c.token_ids[len(turn):c.loss_mask.index(1, len(turn))]) == "u:+1=<eos>a:"
    second = list(engine.calls[1][0].prompt_ids)
    assert second == list(c.prompt_ids) + c.token_ids[: c.loss_mask.index(1, len(turn))]
    # the template itself would have dropped the first turn's thinking from the context
    rendered = tok.apply_chat_template([{"role": "user", "content": "3+4="},
                                        {"role": "assistant", "content": "7<think>ab</think>"},
                                        {"role": "user", "content": "+1="}], add_generation_prompt=True, tokenize=True)
    rendered = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
    assert list(rendered) != second and "<think>" not in tok.decode(rendered)
    # the learner's batch: the response row is the engine's tokens, byte for byte, the environment's masked
    batch = build_batch(comps, [c.env_reward for c in comps], tok.pad_token_id)
    p = batch.prompt_len
    row = batch.input_ids[0, p : p + len(c.token_ids)].tolist()
    assert row == c.token_ids
    assert batch.response_mask[0, : len(c.token_ids)].tolist() == [float(m) for m in c.loss_mask]
    assert batch.engine_logprobs[0, : len(c.token_ids)].tolist() == pytest.approx(c.logprobs)


def test_the_chat_answer_closes_a_turn_cut_short_before_its_end_token(tok):
    tok.chat_template = REWRITING
    tokens = TurnTokens(tok, chat=True)
    assert tok.decode(tokens.ids("+1=", policy_ended=True)) == "u:+1=<eos>a:"
    assert tok.decode(tokens.ids("+1=", policy_ended=False)) == "<eos>u:+1=<eos>a:"
    raw = TurnTokens(tok, chat=False)
    assert raw.ids("+1=", True) == tok.encode("+1=", add_special_tokens=False)
    assert tok.decode(raw.ids("7", True, role="tool")) == "<tool_response>7</tool_response>"
    assert tok.decode(tokens.ids("7", True, role="tool")) == "t:7<eos>a:"  # the template renders the tool turn


@pytest.mark.parametrize("fail, why", [("raise", "raised RuntimeError: the tool broke"),
                                       ("hang", "longer than task.env_timeout_s=0.3"),
                                       ("malformed", "raised TypeError: step() returned dict")])
def test_an_environment_that_fails_ends_its_episode_with_reward_0_and_the_others_go_on(tok, fail, why):
    good = requests(tok, prompts=("1+1=",), n=1, env_args={"turns": 3}, env_timeout_s=0.3)
    bad = requests(tok, prompts=("2+2=",), n=1, env_args={"turns": 3, "fail": fail}, env_timeout_s=0.3)
    bad = [dataclasses.replace(bad[0], group_id=1)]
    comps, _ = play(tok, good + bad)
    ok, failed = comps
    assert ok.env_error == "" and ok.env_reward == 3.0 and ok.turns == 3
    assert why in failed.env_error and failed.env_reward == 0.0 and failed.turns == 2


def test_async_environments_and_the_bounds(tok):
    comps, _ = play(tok, requests(tok, env="episode_envs:AsyncEnv", env_args={"turns": 9}, max_turns=2))
    assert all(c.turns == 2 and c.finish_reason == "length" and c.env_reward == 2.0 for c in comps)
    turn = len(tok.encode("7<think>ab</think>", add_special_tokens=False)) + 1
    comps, _ = play(tok, requests(tok, env_args={"turns": 9}, max_total_tokens=2 * turn + 5))
    for c in comps:
        assert len(c.token_ids) <= 2 * turn + 5 and c.finish_reason == "length"


def test_the_same_requests_give_the_same_episodes(tok):
    reqs = requests(tok, prompts=("3+4=", "1+2="), env_args={"turns": 3})
    first, _ = play(tok, reqs)
    again, _ = play(tok, reqs)
    assert [dataclasses.asdict(c) for c in first] == [dataclasses.asdict(c) for c in again]


def test_the_example_environment_in_the_docs_plays_by_the_protocol():
    import random
    import re
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    code = re.search(r"```python\n(.*?)```", docs, re.S).group(1)
    assert len(code.splitlines()) <= 32
    space: dict = {}
    exec(compile(code, "environments.md", "exec"), space)  # noqa: S102 - the docs' own example
    env = space["GuessTheNumber"](top=16, guesses=4)
    [prompt] = env.draw(random.Random(0), 1)
    rewards = []
    for seed in range(20):  # bisection needs up to 5 guesses for 16 numbers: with 4, most secrets are found
        env.reset(prompt, seed)
        lo, hi, step = 0, 16, None
        while step is None or not step.done:
            guess = (lo + hi) // 2
            step = env.step(f"I guess {guess}")
            lo, hi = (guess + 1, hi) if step.observation == "Higher." else (lo, guess) if step.observation else (lo, hi)
        rewards.append(step.reward)
    assert max(rewards) == 1.0 and min(rewards) >= 0.0 and any(0 < r < 1 for r in rewards)
    env.reset(prompt, 0)
    assert env.step("no number here").observation == "Answer with a number."


class SlowStandIn(StandInEngine):
    """StandInEngine taking 0.02 s per call and noting when each call came, safe to call from several threads at
    once (as vLLM's engine is)."""

    def __init__(self, tok):
        super().__init__(tok)
        self.at = []

    def generate(self, requests):
        self.at.append(time.time())
        time.sleep(0.02)
        return super().generate(requests)


def test_episodes_on_their_own_take_their_turns_while_other_episodes_tools_run(tok):
    reqs = requests(tok, env="episode_envs:SlowEvenEnv", n=8, env_args={"turns": 3})
    runs = {}
    for in_turns in (True, False):
        engine = SlowStandIn(tok)
        episodes = Episodes(engine.generate, reqs, tok, in_turns=in_turns)
        t0 = time.time()
        comps, idle = episodes.run()
        runs[in_turns] = (comps, idle, [t - t0 for t in engine.at], episodes.spans)
    together, alone = runs[True], runs[False]
    # the same episodes, token for token (the stand-in samples the same whatever the seed)
    assert [c.token_ids for c in together[0]] == [c.token_ids for c in alone[0]]
    assert [c.loss_mask for c in together[0]] == [c.loss_mask for c in alone[0]]
    assert all(c.env_reward == 3.0 and c.turns == 3 for c in alone[0])
    # in turns, every turn waits for the slowest tool (three batched calls, 0.5 s apart); alone, the four fast
    # episodes take all their turns while the slow ones' first tool call runs (each turn a call of its own)
    assert len(together[2]) == 3 and sum(t < 0.4 for t in together[2]) == 1
    assert len(alone[2]) == 8 * 3 and sum(t < 0.4 for t in alone[2]) >= 4 * 3 + 4
    assert together[1] > 0.9  # the engine idles while the tools run: counted as env time
    for spans in (together[3], alone[3]):
        assert {phase for phase, _, _ in spans} == {"generate", "env"}
        ordered = sorted(spans, key=lambda s: s[1])
        assert all(a[2] <= b[1] + 1e-6 for a, b in zip(ordered, ordered[1:]))  # one thing at a time


def test_an_environment_call_waiting_for_a_free_worker_is_not_timed_out_for_the_wait(tok):
    # 6 episodes, one worker, 0.2 s a step: the last call starts 1 s after it was queued, well over the 0.5 s bound
    comps, _ = play(tok, requests(tok, env="episode_envs:SleepyEnv", n=6, env_args={"turns": 1}, env_workers=1,
                                  env_timeout_s=0.5))
    assert [c.env_error for c in comps] == [""] * 6 and all(c.env_reward == 1.0 for c in comps)


def test_a_call_that_timed_out_never_changes_its_episode_when_it_returns_late(tok):
    late = requests(tok, env="episode_envs:LateEnv", n=1, env_args={"turns": 3}, env_timeout_s=0.3)
    slow = requests(tok, env="episode_envs:SleepyEnv", prompts=("1+1=",), n=1, env_args={"turns": 6}, env_timeout_s=2, max_turns=8)
    slow = [dataclasses.replace(slow[0], group_id=1)]
    comps, _ = play(tok, late + slow)  # the sleepy episode keeps the call going well past the late answer
    failed = comps[0]
    assert "longer than task.env_timeout_s=0.3" in failed.env_error
    assert failed.env_reward == 0.0 and failed.turns == 2
    turn = len(tok.encode("7<think>ab</think>", add_special_tokens=False)) + 1
    assert len(failed.token_ids) == 2 * turn + 3  # two turns and one answer: nothing appended after the timeout
    assert comps[1].env_error == "" and comps[1].env_reward == 6.0


def test_episodes_awaited_on_an_engines_own_loop_are_the_episodes_played_alone(tok):
    reqs = requests(tok, env="episode_envs:SlowEvenEnv", n=6, env_args={"turns": 2})
    engine = StandInEngine(tok)

    async def turn(batch):  # an engine's asynchronous generate, awaited on the loop the episodes run on
        await asyncio.sleep(0.01)
        return engine.generate(batch)

    awaited, _ = asyncio.run(Episodes(None, reqs, tok, in_turns=False).play(turn))
    alone, _ = Episodes(StandInEngine(tok).generate, reqs, tok, in_turns=False).run()
    assert [c.token_ids for c in awaited] == [c.token_ids for c in alone]
    assert [c.loss_mask for c in awaited] == [c.loss_mask for c in alone]
    assert all(c.turns == 2 and c.env_reward == 2.0 and not c.env_error for c in awaited)
    assert len(engine.calls) == 6 * 2 and all(len(batch) == 1 for batch in engine.calls)  # each turn its own call


def bounded(fn, seconds):
    """fn() in a thread of its own; fails the test when it has not returned within `seconds` (a hang)."""
    import threading

    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: the episodes hang"
    return out["value"]


def gone(pid):
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("in_turns", [True, False])
@pytest.mark.parametrize("fail, call", [("hang", "step"), ("hang_reset", "reset")])
def test_calls_that_hang_are_killed_and_free_their_threads_for_the_calls_queued_behind(tok, tmp_path, in_turns,
                                                                                        fail, call):
    # two threads, and four episodes whose call never answers queued ahead of four that play on: each hung call
    # holds its thread for task.env_timeout_s only, then its process is killed and the thread takes the next call
    (tmp_path / "hung").mkdir()
    (tmp_path / "good").mkdir()
    hung = requests(tok, n=4, env_args={"turns": 3, "fail": fail, "at": 1, "pids": str(tmp_path / "hung")},
                    env_workers=2, env_timeout_s=0.5)
    good = requests(tok, prompts=("1+1=",), n=4, env_args={"turns": 3, "pids": str(tmp_path / "good")},
                    env_workers=2, env_timeout_s=0.5)
    good = [dataclasses.replace(good[0], group_id=1)]
    comps = bounded(lambda: play(tok, hung + good, in_turns=in_turns)[0], 60)
    for c in comps[:4]:
        assert c.env_error == f"the environment's {call}() took longer than task.env_timeout_s=0.5; its process " \
                              "was killed"
        assert c.env_timed_out and c.env_reward == 0.0 and c.finish_reason == "stop"
    assert all(c.env_error == "" and not c.env_timed_out and c.env_reward == 3.0 and c.turns == 3 for c in comps[4:])
    killed = [int(p.name) for p in (tmp_path / "hung").iterdir()]
    kept = [int(p.name) for p in (tmp_path / "good").iterdir()]
    assert len(set(killed)) == 4 and len(set(kept)) == 4  # a process per episode
    deadline = time.time() + 15
    while not all(gone(pid) for pid in killed) and time.time() < deadline:
        time.sleep(0.1)
    assert all(gone(pid) for pid in killed) and not any(gone(pid) for pid in kept)


def test_a_process_whose_episode_ended_plays_a_later_one(tok, tmp_path):
    reqs = requests(tok, n=4, env_args={"turns": 3, "pids": str(tmp_path)})
    play(tok, reqs)
    first = {p.name for p in tmp_path.iterdir()}
    assert len(first) == 4 and str(os.getpid()) not in first  # each episode in a process of its own
    for p in tmp_path.iterdir():
        p.unlink()
    comps, _ = play(tok, reqs)
    assert {p.name for p in tmp_path.iterdir()} == first  # the same four processes, each with a new instance
    assert all(c.env_reward == 3.0 and c.turns == 3 for c in comps)


def test_an_environment_whose_process_dies_ends_only_its_episode(tok):
    good = requests(tok, prompts=("1+1=",), n=1, env_args={"turns": 3})
    bad = requests(tok, prompts=("2+2=",), n=1, env_args={"turns": 3, "fail": "exit"})
    bad = [dataclasses.replace(bad[0], group_id=1)]
    ok, died = bounded(lambda: play(tok, good + bad)[0], 60)
    assert ok.env_error == "" and ok.env_reward == 3.0
    assert died.env_error == "the environment raised RuntimeError: the environment's process exited during step() " \
                             "(EOFError)"
    assert died.env_reward == 0.0 and not died.env_timed_out and died.turns == 2


def test_a_steps_record_counts_the_episodes_that_timed_out():
    from types import SimpleNamespace

    from rlgen.runtime.step.score import episode_metrics

    def episode(error="", timed_out=False):
        return Completion(0, [1], [2, 3], [-0.1, -0.1], "stop", 0, loss_mask=[1, 0], env_reward=0.0, turns=1,
                          env_error=error, env_timed_out=timed_out)

    flight = SimpleNamespace(prepared=[episode(), episode("the environment raised ValueError: x"),
                                       episode("the environment's step() took longer", True)], results={})
    record = episode_metrics(flight)
    assert record["env/errors"] == 2.0 and record["env/timeouts"] == 1.0
