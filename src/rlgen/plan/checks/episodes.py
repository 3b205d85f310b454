"""The checks of a multi-turn task (task.kind=env), before anything starts: the engine kind plays episodes (said
before a server is asked anything), the environment builds, a tool task's model can call tools, and the
episode's bounds hold a whole episode of the environment's own demonstrations. Each problem is one sentence with
its fix; what may still run, but likely not as meant, is a note."""

from __future__ import annotations

from typing import Any

from rlgen.charvocab import EOS
from rlgen.config import PromptFormat, RunConfig, TaskKind
from rlgen.config.compose import group_options
from rlgen.engines.registry import EngineSpec

# an instruct model that calls tools, which the CPU default's tool tasks are pointed at
TOOL_MODEL = "model=qwen2_5_0_5b model.path=Qwen/Qwen2.5-0.5B-Instruct"
DEMOS = 64  # demonstrations measured against the episode's bounds


def check_engine_plays_episodes(cfg: RunConfig, spec: EngineSpec, p: list[str]) -> None:
    """A multi-turn task needs an engine kind that plays episodes (known from the kind alone: no server asked)."""
    if cfg.task.kind == TaskKind.env and not spec.episodes:
        p.append(f"task.kind=env plays multi-turn episodes inside the engines, which engine={spec.kind} does not; "
                 "use engine=hf (CPU or GPU) or engine=vllm.")


def check_episodes(cfg: RunConfig, p: list[str]) -> None:
    """Stop strings, which would cut the environment's turns, and an environment that can be built here."""
    t = cfg.task
    if t.kind != TaskKind.env:
        return
    if t.stop:
        p.append("task.stop cuts a response at a string, which would cut an episode's environment turns too; leave "
                 "task.stop empty for task.kind=env (the environment ends each episode).")
    from rlgen.tasks.base import TaskDataError
    from rlgen.tasks.envs import make_env

    if t.env:  # none: the value checks have said so
        try:
            make_env(t.env, dict(t.env_args))
        except TaskDataError as err:
            p.append(str(err))


def preset_command(cfg: RunConfig, model: str) -> str:
    """The command that trains this environment's task with ``model`` (overrides): its own task preset where
    conf/task/ has one named for it, else task=env task.env=..."""
    env = cfg.task.env or ""
    task = f"task={env}" if env in group_options("task") else f"task=env task.env={env}"
    return f"rlgen train {task} {model}"


def check_episode_task(cfg: RunConfig, task: Any, problems: list[str], notes: list[str]) -> None:
    """A built multi-turn task: its model can call its tools, and its bounds hold its demonstrations."""
    if cfg.task.kind != TaskKind.env or task is None:
        return
    from rlgen.plan.checks.inputs import PromptEncoder

    try:
        encoder = PromptEncoder(cfg)
    except Exception:  # noqa: BLE001 - check_task has said what is wrong with the tokenizer
        return
    check_tool_model(cfg, task, encoder, problems, notes)
    check_episode_room(cfg, task, encoder, problems)


def check_tool_model(cfg: RunConfig, task: Any, encoder: Any, problems: list[str], notes: list[str]) -> None:
    """A tool task's model can call tools: the character models cannot write a tool call at all (refused); a
    model whose prompts do not list the tools (raw prompts, no chat template, or a template that leaves tools
    out) was not made to call them (a note: it runs, likely at reward 0)."""
    schemas = task.tool_schemas()
    if not schemas:
        return
    env, path = cfg.task.env, cfg.model.path
    run = preset_command(cfg, TOOL_MODEL)
    if not path:
        problems.append(f"task.env={env!r} is a tool task: the policy calls its tools with JSON in <tool_call> "
                        f"blocks, which model {cfg.model.name}'s character vocabulary cannot write (it has no "
                        f"braces); run it with an instruct model that calls tools: {run}")
        return
    if not encoder.renderer.chat:
        why = ("task.prompt_format=raw" if cfg.task.prompt_format == PromptFormat.raw else
               f"the tokenizer of model.path={path} has no chat template (it is not an instruct model)")
        notes.append(f"task.env={env!r} is a tool task, but {why}: its prompts never describe the tools, and the "
                     "reward stays 0 unless the model already writes <tool_call> blocks; use an instruct model that "
                     f"calls tools, e.g. {run}.")
    elif not _template_lists_tools(cfg, encoder, schemas):
        notes.append(f"task.env={env!r} is a tool task, but the chat template of model.path={path} leaves out the "
                     "tools it is given, so the model was not trained to call them and the reward likely stays 0; "
                     f"use an instruct model that calls tools, e.g. {run}.")


def _template_lists_tools(cfg: RunConfig, encoder: Any, schemas: list[dict[str, Any]]) -> bool:
    """Whether the chat template renders a prompt differently when it is given the tools."""
    from rlgen.tasks.prompts import PromptRenderer

    tokenizer = encoder.renderer.tokenizer
    try:
        with_tools = PromptRenderer(tokenizer, cfg.task, tools=schemas).ids("x")
        return with_tools != PromptRenderer(tokenizer, cfg.task).ids("x")
    except Exception:  # noqa: BLE001 - a template that fails when given tools does not take them
        return False


def check_episode_room(cfg: RunConfig, task: Any, encoder: Any, problems: list[str]) -> None:
    """task.max_turns and task.max_total_tokens hold a whole episode as the environment's own demonstrations
    play it (the policy's turns, each with its end-of-sequence token, and the environment's answers between):
    else every such episode would be cut short, silently."""
    if not callable(getattr(getattr(task, "env", None), "demonstrations", None)):
        return
    from rlgen.tasks.base import TaskDataError

    try:
        demos = task.demonstrations(DEMOS, cfg.seed)
    except TaskDataError as err:
        problems.append(str(err))
        return
    if not demos:
        return
    tokenizer = encoder.renderer.tokenizer
    turns = max(d.answer.count(EOS) + 1 for d in demos)
    tokens = max(sum(len(tokenizer.encode(part, add_special_tokens=False)) + 1 for part in d.answer.split(EOS))
                 for d in demos)
    t = cfg.task
    if t.max_turns < turns:
        problems.append(f"task.max_turns={t.max_turns} ends the episodes of task.env={t.env!r} before their "
                        f"{turns} turns (its demonstrations take {turns}); raise task.max_turns to {turns} or more.")
    if t.max_total_tokens < tokens:
        problems.append(f"task.max_total_tokens={t.max_total_tokens} cannot hold a whole episode of "
                        f"task.env={t.env!r}: its demonstrations take up to {tokens} tokens after the prompt (the "
                        f"policy's {turns} turns and the environment's answers between), so episodes would be cut "
                        f"short; raise task.max_total_tokens to {tokens} or more.")
