"""Prompts and answers read from a JSON Lines file: one {"prompt": str, "answer": str} object per line."""

from __future__ import annotations

import json
from pathlib import Path

from rlgen.config import TaskConfig
from rlgen.tasks.base import Prompt, TaskDataError, clamp_reward, step_rng
from rlgen.tasks.rewards import resolve_reward

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


class JsonlTask:
    name = "jsonl"

    def __init__(self, cfg: TaskConfig):
        if not cfg.path:
            raise TaskDataError(f"task.kind=jsonl needs task.path: a JSON Lines file where {ROW_SHAPE}.")
        self.path = Path(cfg.path).expanduser()
        self.rows = load_rows(self.path)
        self.seed = cfg.seed
        self._reward = resolve_reward(cfg.reward)
        self._orders: dict[tuple[int, int], list[int]] = {}

    def _order(self, seed: int, epoch: int) -> list[int]:
        key = (seed, epoch)
        if key not in self._orders:
            order = list(range(len(self.rows)))
            step_rng(seed, "epoch", epoch).shuffle(order)
            if len(self._orders) >= 4:
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = order
        return self._orders[key]

    def _take(self, seed: int, start: int, n: int) -> list[Prompt]:
        out: list[Prompt] = []
        index = start
        while len(out) < n:
            epoch, pos = divmod(index, len(self.rows))
            chunk = self._order(seed, epoch)[pos : pos + n - len(out)]
            out.extend(self.rows[i] for i in chunk)
            index += len(chunk)
        return out

    def prompts(self, step: int, n: int) -> list[Prompt]:
        """Step s takes rows s*n .. s*n+n-1 of an endless sequence of seeded shuffles of the file."""
        return self._take(self.seed, step * n, n)

    def demonstrations(self, n: int, seed: int) -> list[Prompt]:
        return self._take(seed, 0, n)

    def reward(self, completion: str, prompt: Prompt) -> float:
        return clamp_reward(self._reward(completion, prompt.answer))
