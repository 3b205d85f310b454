"""Tasks: where prompts, demonstrations and rewards come from. Pure Python (no torch)."""

from __future__ import annotations

from rlgen.config import TaskConfig, TaskKind
from rlgen.tasks.arith import ArithTask
from rlgen.tasks.base import Prompt, Task, TaskDataError
from rlgen.tasks.dataset import DatasetTask
from rlgen.tasks.env_task import EnvTask
from rlgen.tasks.jsonl import JsonlTask
from rlgen.tasks.reverse import ReverseTask

_TASKS: dict[TaskKind, type] = {
    TaskKind.arith: ArithTask,
    TaskKind.reverse: ReverseTask,
    TaskKind.jsonl: JsonlTask,
    TaskKind.dataset: DatasetTask,
    TaskKind.env: EnvTask,
}


def build_task(cfg: TaskConfig) -> Task:
    try:
        kind = TaskKind(cfg.kind)
    except ValueError as err:
        raise TaskDataError(
            f"task.kind={cfg.kind!r} is not a task; use one of {', '.join(k.value for k in TaskKind)}."
        ) from err
    return _TASKS[kind](cfg)


def task_libraries(cfg: TaskConfig) -> tuple[str, ...]:
    """The libraries the task kind loads its data with (its class's ``libraries``): set-up imports them whole on
    one thread before its loaders run side by side."""
    try:
        return tuple(getattr(_TASKS[TaskKind(cfg.kind)], "libraries", ()))
    except ValueError:
        return ()


__all__ = ["ArithTask", "DatasetTask", "JsonlTask", "Prompt", "ReverseTask", "Task", "TaskDataError", "build_task", "task_libraries"]
