import json
import re
import subprocess
import sys
import types

import pytest

from rlgen.config import TaskConfig, TaskKind
from rlgen.tasks import Prompt, Task, TaskDataError, build_task
from rlgen.tasks.rewards import RewardSpecError


def arith(**kw) -> Task:
    return build_task(TaskConfig(kind=TaskKind.arith, **kw))


def reverse(**kw) -> Task:
    kw.setdefault("reward", "char_match")
    return build_task(TaskConfig(kind=TaskKind.reverse, **kw))


def jsonl(path, **kw) -> Task:
    return build_task(TaskConfig(kind=TaskKind.jsonl, path=str(path), **kw))


# --- arith -------------------------------------------------------------------------------------------------


def test_arith_prompts_are_sums_within_range():
    task = arith(max_operand=7)
    prompts = task.prompts(0, 200)
    assert len(prompts) == 200
    seen = set()
    for p in prompts:
        m = re.fullmatch(r"(\d+)\+(\d+)=", p.text)
        assert m, p.text
        a, b = int(m.group(1)), int(m.group(2))
        assert 0 <= a < 7 and 0 <= b < 7
        assert p.answer == str(a + b)
        seen.update((a, b))
    assert seen == set(range(7))  # both ends of the range occur


def test_arith_reward_exact_answer_only():
    task = arith()
    p = Prompt("12+7=", "19")
    assert task.reward("19", p) == 1.0
    assert task.reward("18", p) == 0.0
    assert task.reward("191", p) == 0.0  # kept going instead of stopping
    assert task.reward("", p) == 0.0


def test_prompts_deterministic_per_seed_and_step():
    a, b = arith(seed=3), arith(seed=3)
    assert a.prompts(5, 16) == b.prompts(5, 16)
    assert a.prompts(5, 16) != a.prompts(6, 16)
    assert a.prompts(5, 16) != arith(seed=4).prompts(5, 16)
    r = reverse(seed=1)
    assert r.prompts(2, 16) == reverse(seed=1).prompts(2, 16)
    assert r.prompts(2, 16) != r.prompts(3, 16)


def test_demonstrations_are_correct_and_seeded():
    task = arith()
    demos = task.demonstrations(50, seed=0)
    assert len(demos) == 50
    for d in demos:
        a, b = d.text[:-1].split("+")
        assert d.answer == str(int(a) + int(b))
    assert demos == task.demonstrations(50, seed=0)
    assert demos != task.demonstrations(50, seed=1)


def test_arith_rejects_prompts_longer_than_budget():
    with pytest.raises(TaskDataError, match="max_prompt_tokens"):
        arith(max_operand=1000, max_prompt_tokens=6)
    with pytest.raises(TaskDataError, match="max_operand"):
        arith(max_operand=0)


# --- reverse -----------------------------------------------------------------------------------------------


def test_reverse_prompts_and_answers():
    task = reverse(length=5, alphabet="xyz", max_prompt_tokens=8)
    for p in task.prompts(0, 50):
        word = p.text[:-1]
        assert p.text.endswith(">") and len(word) == 5
        assert set(word) <= set("xyz")
        assert p.answer == word[::-1]
        assert len(p.text) <= 8


def test_reverse_reward_gives_partial_credit():
    task = reverse()
    p = Prompt("abcd>", "dcba")
    assert task.reward("dcba", p) == 1.0
    assert task.reward("dcbb", p) == pytest.approx(0.75)
    assert task.reward("dcbaa", p) == pytest.approx(0.8)  # an extra letter costs
    assert task.reward("", p) == 0.0


def test_reverse_rejects_bad_settings():
    with pytest.raises(TaskDataError, match="max_prompt_tokens"):
        reverse(length=10, max_prompt_tokens=8)
    with pytest.raises(TaskDataError, match="alphabet"):
        reverse(alphabet="")
    with pytest.raises(TaskDataError, match="alphabet"):
        reverse(alphabet="ab>")


# --- jsonl -------------------------------------------------------------------------------------------------


def write(tmp_path, text: str, name: str = "rows.jsonl"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_good_file(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": f"a{i}", "source": "extra keys are fine"} for i in range(5)]
    path = write(
        tmp_path,
        "\n".join(json.dumps(r) for r in rows[:3]) + "\n\n   \n" + "\n".join(json.dumps(r) for r in rows[3:]),
    )
    task = jsonl(path)
    assert task.name == "jsonl"
    expected = {Prompt(r["prompt"], r["answer"]) for r in rows}
    assert set(task.demonstrations(5, seed=0)) == expected
    # one step of len(rows) prompts is a permutation of the file; later steps keep cycling through it
    assert set(task.prompts(0, 5)) == expected
    assert sorted(task.prompts(1, 5) + task.prompts(2, 5), key=str) == sorted(list(expected) * 2, key=str)
    assert task.prompts(0, 5) == jsonl(path).prompts(0, 5)
    p = Prompt("q0", "a0")
    assert task.reward("a0", p) == 1.0
    assert task.reward("a1", p) == 0.0


def test_jsonl_order_is_shuffled(tmp_path):
    path = write(
        tmp_path, "".join(json.dumps({"prompt": str(i), "answer": str(i)}) + "\n" for i in range(20))
    )
    task = jsonl(path)
    order = [p.text for p in task.prompts(0, 20)]
    assert sorted(order, key=int) == [str(i) for i in range(20)]
    assert order != [str(i) for i in range(20)]
    assert order != [p.text for p in task.prompts(1, 20)]  # each pass reshuffles
    assert order != [p.text for p in jsonl(path, seed=1).prompts(0, 20)]


def test_jsonl_prompts_cross_epoch_boundary(tmp_path):
    path = write(tmp_path, "".join(json.dumps({"prompt": str(i), "answer": str(i)}) + "\n" for i in range(3)))
    task = jsonl(path)
    flat = [p.text for step in range(4) for p in task.prompts(step, 2)]  # 8 prompts over 3 rows
    assert len(flat) == 8
    assert sorted(flat[:3]) == sorted(flat[3:6]) == ["0", "1", "2"]


GOOD = '{"prompt": "1+1=", "answer": "2"}\n'
BAD_FILES = [
    (GOOD + GOOD + '{"prompt": "x"}\n', 3, '"answer" is missing'),
    ('{"answer": "2"}\n', 1, '"prompt" is missing'),
    (GOOD + "\n" + "{not json\n", 3, "not valid JSON"),
    (GOOD + "[1, 2]\n", 2, "not an object"),
    (GOOD + '"just a string"\n', 2, "not an object"),
    ('{"prompt": 3, "answer": "3"}\n', 1, '"prompt" must be a string, not number'),
    (GOOD + '{"prompt": "a", "answer": null}\n', 2, '"answer" must be a string, not null'),
    ("", 1, "no rows"),
    ("\n  \n", 1, "no rows"),
]


@pytest.mark.parametrize(("text", "line", "fragment"), BAD_FILES)
def test_jsonl_bad_rows_name_file_and_line(tmp_path, text, line, fragment):
    path = write(tmp_path, text)
    with pytest.raises(TaskDataError) as info:
        jsonl(path)
    msg = str(info.value)
    assert f"rows.jsonl:{line}:" in msg
    assert fragment in msg
    assert '{"prompt": "...", "answer": "..."}' in msg  # says how to fix it


def test_jsonl_missing_path_and_file(tmp_path):
    with pytest.raises(TaskDataError, match="task.path"):
        build_task(TaskConfig(kind=TaskKind.jsonl))
    with pytest.raises(TaskDataError, match="does not exist"):
        jsonl(tmp_path / "absent.jsonl")
    with pytest.raises(TaskDataError, match="is a folder"):
        jsonl(tmp_path)


def test_jsonl_allows_a_byte_order_mark_and_names_each_rows_source(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (GOOD * 2).encode())
    rows = jsonl(path).rows
    assert [r.text for r in rows] == ["1+1=", "1+1="]
    assert [r.source for r in rows] == ["bom.jsonl:1", "bom.jsonl:2"]


def test_every_bad_row_is_reported_not_only_the_first(tmp_path):
    from rlgen.tasks.jsonl import read_rows

    rows, problems = read_rows(write(tmp_path, GOOD + "{bad\n" + GOOD + '{"prompt": "x"}\n'))
    assert len(rows) == 2
    assert [p.split(":")[1] for p in problems] == ["2", "4"]


# --- registry and rewards ----------------------------------------------------------------------------------


def test_build_task_by_kind():
    assert build_task(TaskConfig(kind=TaskKind.arith)).name == "arith"
    assert build_task(TaskConfig(kind="reverse")).name == "reverse"
    assert isinstance(build_task(TaskConfig()), Task)
    with pytest.raises(TaskDataError, match="not a task"):
        build_task(TaskConfig(kind="sorting"))


def test_custom_reward_is_clamped(monkeypatch):
    module = types.ModuleType("user_rewards")
    module.generous = lambda completion, answer: 5.0
    module.harsh = lambda completion, answer: -1.0
    monkeypatch.setitem(sys.modules, "user_rewards", module)
    p = Prompt("1+1=", "2")
    assert arith(reward="user_rewards:generous").reward("x", p) == 1.0
    assert arith(reward="user_rewards:harsh").reward("2", p) == 0.0
    assert arith(reward="contains").reward("the answer is 2", p) == 1.0
    with pytest.raises(RewardSpecError):
        arith(reward="no_such_reward")


def test_tasks_import_without_torch():
    code = "import sys, rlgen.tasks; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
