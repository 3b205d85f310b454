"""task=verifiers: an environment built with verifiers' own classes (tests/envs/vf_chain.py: a MultiTurnEnv, a
Rubric, a dataset) plays unchanged through rlgen's environment protocol. Its first model call's messages are the
episode's opening, its env_response the environment's turn, its rubric's score the reward. Loading it leaves the
process's signal handlers alone, and a missing id is one sentence."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest

from rlgen.tasks.base import TaskDataError
from rlgen.tasks.envs import Opening, make_env

pytest.importorskip("verifiers")
pytest.importorskip("openai")
ENVS = Path(__file__).resolve().parents[1] / "envs"


@pytest.fixture(autouse=True)
def envs_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))


def play(env, prompt, replies):
    opening = env.reset(prompt, seed=0)
    steps = [env.step(r) for r in replies]
    env.close()
    return opening, steps


def test_a_multi_turn_env_plays_its_own_turns_and_its_rubric_scores_the_episode():
    env = make_env("verifiers", {"env": "vf_chain", "args": {"rows": 8}})
    prompt = env.draw(random.Random(0), 1)[0]
    row = env.rows[int(prompt.source.rpartition(":")[2])]
    assert prompt.text == row["question"] and prompt.answer == row["answer"]
    first = str(int(prompt.answer) - row["info"]["add"])
    opening, (mid, last) = play(env, prompt, [first, prompt.answer])
    assert isinstance(opening, Opening) and opening.messages == [{"role": "user", "content": row["question"]}]
    assert not mid.done and mid.observation == [{"role": "user", "content": f"+{row['info']['add']}="}]
    assert last.done and last.reward == 1.0
    _, (_, wrong) = play(make_env("verifiers", {"env": "vf_chain", "args": {"rows": 8}}), prompt,
                         [first, str(int(prompt.answer) + 1)])
    assert wrong.done and wrong.reward == 0.0


def test_loading_keeps_the_runs_own_signal_handlers():
    def mine(signum, frame):
        return None

    before = signal.signal(signal.SIGTERM, mine)
    try:
        make_env("verifiers", {"env": "vf_chain", "args": {"rows": 5, "seed": 9}})  # a fresh load
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("args, said", [
    ({"env": "no_such_vf_env"}, "cannot load environment 'no_such_vf_env'"),
    ({"env": "vf_chain", "args": {"colour": 1}}, "cannot load environment 'vf_chain'"),
    ({}, "needs task.env_args.env="),
])
def test_a_wrong_id_or_argument_is_one_sentence(args, said):
    with pytest.raises(TaskDataError, match=said):
        make_env("verifiers", args)


def test_a_tool_env_sees_its_tools_and_gets_the_policys_tool_calls_as_openai_tool_calls():
    env = make_env("verifiers", {"env": "vf_tools"})
    prompt = env.draw(random.Random(1), 1)[0]
    a, b = (int(w) for w in prompt.text.replace("?", " ").split() if w.isdigit())
    call = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    opening, (tool, last) = play(env, prompt, [call, str(a + b)])
    assert [t["function"]["name"] for t in opening.tools] == ["add"]
    assert not tool.done and tool.role == "user"  # the observation is a message list; its roles say what it is
    assert [m["role"] for m in tool.observation] == ["tool"] and tool.observation[0]["content"] == str(a + b)
    assert last.done and last.reward == 1.0


def test_a_failed_load_is_rlgens_one_sentence_with_the_cause_and_no_library_log_line(capfd, caplog):
    # verifiers logs its failure before raising; the run says it once, in its own sentence, with the cause
    for _ in range(2):  # the plan and the task each load it: still no library line
        with pytest.raises(TaskDataError) as err:
            make_env("verifiers", {"env": "no_such_vf_env"})
    assert "ModuleNotFoundError: No module named 'no_such_vf_env'" in str(err.value)
    out, logged = capfd.readouterr()
    assert "Failed to import environment module" not in out + logged, out + logged
    assert not [r for r in caplog.records if "Failed to import environment module" in r.getMessage()]
