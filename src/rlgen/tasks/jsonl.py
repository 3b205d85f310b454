"""Prompts and answers read from a JSON Lines file: one {"prompt": str, "answer": str} object per line."""

from __future__ import annotations

import json
from pathlib import Path

from rlgen.config import TaskConfig
from rlgen.tasks.base import Prompt, RowTask, TaskDataError, split_held_out

ROW_SHAPE = 'each line must be {"prompt": "...", "answer": "..."}'


def _json_type(value: object) -> str:
    names = {
        type(None): "null",
        bool: "boolean",
        int: "number",
        float: "number",
        str: "string",
        list: "array",
    }
    return names.get(type(value), "object")


def _parse_line(line: str, where: str) -> Prompt:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise TaskDataError(f"{where}: not valid JSON ({err.msg}); {ROW_SHAPE}") from err
    if not isinstance(row, dict):
        raise TaskDataError(f"{where}: a JSON {_json_type(row)}, not an object; {ROW_SHAPE}")
    for key in ("prompt", "answer"):
        if key not in row:
            raise TaskDataError(f'{where}: "{key}" is missing; {ROW_SHAPE}')
        if not isinstance(row[key], str):
            raise TaskDataError(f'{where}: "{key}" must be a string, not {_json_type(row[key])}; {ROW_SHAPE}')
    return Prompt(row["prompt"], row["answer"], where)


def read_rows(path: str | Path) -> tuple[list[Prompt], list[str]]:
    """Every row that parses, and one sentence per bad row (file:line and the fix). A UTF-8 byte-order mark
    is allowed. A file that cannot be read at all raises TaskDataError."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise TaskDataError(f"task.path={path} is a folder; point it at a JSON Lines file ({ROW_SHAPE}).")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as err:
        raise TaskDataError(
            f"task.path={path} does not exist; point it at a JSON Lines file ({ROW_SHAPE})."
        ) from err
    except PermissionError as err:
        raise TaskDataError(f"task.path={path} cannot be read (permission denied); fix its permissions.") from err
    except UnicodeDecodeError as err:
        raise TaskDataError(f"{path}: not UTF-8 text ({err.reason}); save the file as UTF-8.") from err
    rows: list[Prompt] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(_parse_line(line, f"{path.name}:{number}"))
        except TaskDataError as err:
            problems.append(str(err))
    if not rows and not problems:
        problems.append(f"{path.name}:1: the file has no rows; {ROW_SHAPE}")
    return rows, problems


def load_rows(path: str | Path) -> list[Prompt]:
    """Read and check every row; the first bad one raises TaskDataError naming file:line."""
    rows, problems = read_rows(path)
    if problems:
        raise TaskDataError(problems[0] + (f" ({len(problems) - 1} more bad rows)" if len(problems) > 1 else ""))
    return rows


class JsonlTask(RowTask):
    name = "jsonl"

    def __init__(self, cfg: TaskConfig):
        if not cfg.path:
            raise TaskDataError(f"task.kind=jsonl needs task.path: a JSON Lines file where {ROW_SHAPE}.")
        super().__init__(cfg)
        self.path = Path(cfg.path).expanduser()
        rows = load_rows(self.path)
        if cfg.eval_path:
            self.rows, self.held_out = rows, load_rows(cfg.eval_path)
        else:
            self.rows, self.held_out = split_held_out(rows, cfg.eval_fraction, cfg.seed)
