"""What the validation pass says about multi-turn tasks before anything starts: an environment that cannot be built
or cannot draw its prompts is one sentence naming task.env, whatever it raises; a tool task on a model that
cannot call tools is refused (the character models) or warned about (a model whose prompts do not list the
tools); bounds too small for the environment's own episodes are refused; and engine=remote is told it plays no
episodes before any server is asked. The sentences the command line prints are in tests/data/bad_inputs.yaml."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan import PlanError, build_plan
from rlgen.plan.preflight import preflight
from rlgen.tasks import build_task
from rlgen.tasks.base import TaskDataError
from rlgen.tasks.envs import make_env

ENVS = Path(__file__).resolve().parents[1] / "envs"
SMALL = ["task.max_prompt_tokens=8", "task.max_total_tokens=16"]
# a ChatML template that lists the tools it is given, as instruct models' templates do
TOOLS_TEMPLATE = ("{% if tools %}{{ '<|im_start|>system\\nTools: ' + tools | tojson + '<|im_end|>\\n' }}{% endif %}"
                  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                  "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                  "{% endif %}")


@pytest.fixture(autouse=True)
def envs_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))


def test_an_environment_whose_constructor_raises_anything_is_one_sentence_naming_task_env():
    with pytest.raises(TaskDataError) as err:
        make_env("episode_envs:Unbuildable", {})
    assert str(err.value) == ("task.env='episode_envs:Unbuildable' cannot be built with task.env_args={}: its "
                              "constructor raised RuntimeError: no licence server; fix what it needs (or its "
                              "arguments).")
    report = preflight(compose_run_config(["task=env", "task.env=episode_envs:Unbuildable", *SMALL]), machine=False)
    assert str(err.value) in report.problems


def test_an_environment_whose_draw_raises_is_one_sentence_naming_task_env():
    cfg = compose_run_config(["task=env", "task.env=episode_envs:NoDraw", *SMALL])
    with pytest.raises(TaskDataError, match=r"task.env='episode_envs:NoDraw': its draw\(rng, n\) raised KeyError"):
        build_task(cfg.task).prompts(0, 4)
    report = preflight(cfg, machine=False)
    assert report.problems == ["task.env='episode_envs:NoDraw': its draw(rng, n) raised KeyError: 'rows'; fix it, or "
                               "give task.path=<rows.jsonl> with {\"prompt\", \"answer\"} rows."]


def test_a_draw_that_returns_no_prompts_is_named():
    task = build_task(compose_run_config(["task=env", "task.env=episode_envs:NoDraw", *SMALL]).task)
    task.env.draw = lambda rng, n: [{"prompt": "1+1="}] * n
    with pytest.raises(TaskDataError, match=r"its draw\(rng, 3\) returned a dict; it must return a list of 3"):
        task.prompts(0, 3)


@pytest.mark.parametrize("task", ["calculator", "python"])
def test_a_tool_task_on_the_cpu_default_is_refused_with_the_command_that_runs_it(task):
    report = preflight(compose_run_config([f"task={task}"]), machine=False)
    command = f"rlgen train task={task} model=qwen2_5_0_5b model.path=Qwen/Qwen2.5-0.5B-Instruct"
    assert any(p.endswith(f"cannot write (it has no braces); run it with an instruct model that calls tools: {command}")
               for p in report.problems), report.problems
    # the command's model has the positions the preset's episodes need (its weights come from model.path)
    build_plan(compose_run_config([f"task={task}", "model=qwen2_5_0_5b"]))
    # budgets that fit the tiny model do not make the tools callable
    small = preflight(compose_run_config([f"task={task}", "task.max_prompt_tokens=112", "task.max_total_tokens=16"]),
                      machine=False)
    assert small.plan is not None and len(small.problems) == 1 and command in small.problems[0]


def _folder(local_model: Path, tmp_path: Path, template: str | None) -> Path:
    """The local model folder, with its tokenizer's chat template replaced (None: no template)."""
    folder = tmp_path / "model"
    shutil.copytree(local_model / "model", folder)
    config = folder / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data.pop("chat_template", None)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    if template is not None:
        data["chat_template"] = template
    config.write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("template, said", [
    (None, "but the tokenizer of model.path={path} has no chat template (it is not an instruct model): its prompts "
           "never describe the tools"),
    ("plain", "but the chat template of model.path={path} leaves out the tools it is given"),
    ("tools", None),
])
def test_a_tool_task_whose_model_does_not_list_tools_is_warned_about(local_model, tmp_path, template, said):
    from rlgen.models.local import CHAT_TEMPLATE

    folder = _folder(local_model, tmp_path, {"plain": CHAT_TEMPLATE, "tools": TOOLS_TEMPLATE}.get(template))
    cfg = compose_run_config(["task=calculator", f"model.path={folder}", "task.max_prompt_tokens=256",
                              "task.max_total_tokens=256"])
    report = preflight(cfg, machine=False)
    assert report.problems == []
    if said is None:
        assert report.notes == []
    else:
        [note] = report.notes
        assert note.startswith("task.env='calculator' is a tool task, ") and said.format(path=folder) in note
        assert note.endswith("e.g. rlgen train task=calculator model=qwen2_5_0_5b "
                             "model.path=Qwen/Qwen2.5-0.5B-Instruct.")


def test_rlgen_plan_prints_the_warning(local_model, tmp_path, capsys):
    from rlgen.cli import main

    folder = _folder(local_model, tmp_path, None)
    assert main(["plan", "task=calculator", f"model.path={folder}", "task.max_prompt_tokens=256",
                 "task.max_total_tokens=256"]) == 0
    assert "warning: task.env='calculator' is a tool task, but the tokenizer" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, said", [
    (["task.max_total_tokens=2"], "task.max_total_tokens=2 cannot hold a whole episode of task.env='chain': its "
                                  "demonstrations take up to 9 tokens after the prompt (the policy's 2 turns and the "
                                  "environment's answers between), so episodes would be cut short; raise "
                                  "task.max_total_tokens to 9 or more."),
    (["task.max_turns=1"], "task.max_turns=1 ends the episodes of task.env='chain' before their 2 turns (its "
                           "demonstrations take 2); raise task.max_turns to 2 or more."),
    (["++task.env_args.links=3", "task.max_total_tokens=12"], "task.max_turns=2 ends the episodes of "
                                                                "task.env='chain' before their 3 turns"),
])
def test_bounds_too_small_for_the_environments_own_episodes_are_refused(overrides, said):
    report = preflight(compose_run_config(["task=chain", *overrides]), machine=False)
    assert any(said in p for p in report.problems), report.problems


def test_the_chain_presets_bounds_hold_its_episodes():
    assert preflight(compose_run_config(["task=chain"]), machine=False).problems == []


def test_engine_remote_is_told_it_plays_no_episodes_before_any_server_is_asked(monkeypatch):
    import rlgen.engines.remote.plan as remote

    def asked(*args, **kwargs):
        raise AssertionError("a server was asked")

    monkeypatch.setattr(remote, "fetch_info", asked)
    for url in ([], ["engine.url=http://127.0.0.1:9"]):
        with pytest.raises(PlanError) as err:
            build_plan(compose_run_config(["task=chain", "engine=remote", *url]))
        assert err.value.problems == ["task.kind=env plays multi-turn episodes inside the engines, which "
                                      "engine=remote does not; use engine=hf (CPU or GPU) or engine=vllm."]
