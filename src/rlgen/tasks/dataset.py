"""Rows of a local data set (JSON Lines, JSON, Parquet or CSV), read with Hugging Face ``datasets``.

A row's prompt is ``task.prompt_key``'s field, or ``task.template`` filled from every field of the row; its
reference answer is read out of ``task.answer_key`` in ``task.answer_format`` (GSM8K's "#### 72", MATH's
\\boxed{...}). ``task.path`` is a file (all its rows) or a folder of split files (train*.jsonl, test*.jsonl, ...,
picked by ``task.split``). Held-out rows for evaluation come from ``task.eval_path`` or ``task.eval_fraction``.
The presets task=gsm8k and task=math set these for those data sets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlgen.config import TaskConfig
from rlgen.tasks.answers import reference_answer
from rlgen.tasks.base import Prompt, RowTask, TaskDataError, split_held_out

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
MAX_ROW_PROBLEMS = 5


def _load(path: str, split: str) -> list[dict[str, Any]]:
    """The rows of one split of a local file or folder, as dicts."""
    try:
        import datasets
    except ImportError as err:
        raise TaskDataError("task=dataset reads files with Hugging Face datasets, which is not installed; "
                            "pip install 'rlgen[data]'.") from err
    p = Path(path).expanduser()
    if not p.exists():
        raise TaskDataError(f"task.path={path} does not exist; point it at a JSONL, JSON, Parquet or CSV file, or a "
                            "folder of them.")
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.suffix in BUILDERS)
    if not files:
        raise TaskDataError(f"task.path={path} holds no .jsonl, .json, .parquet or .csv file.")
    kinds = {BUILDERS.get(f.suffix) for f in files}
    if None in kinds or len(kinds) > 1:
        raise TaskDataError(f"task.path={path}: files must all be one of {', '.join(BUILDERS)} ({files[0].name} ...).")
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    if p.is_file():
        if split != "train":
            raise TaskDataError(f"task.split={split} picks a split file in a folder, but task.path={path} is one file "
                                "(all its rows); leave task.split=train or point task.path at the folder.")
        data_files: Any = str(p)
    else:
        named = [f for f in files if f.name.startswith(split)]
        if not named:
            raise TaskDataError(f"task.path={path} has no file for task.split={split} (files: "
                                f"{', '.join(f.name for f in files[:6])}); name one {split}*{files[0].suffix}.")
        data_files = [str(f) for f in named]
    try:
        ds = datasets.load_dataset(kinds.pop(), data_files=data_files, split="train")
    except Exception as err:  # noqa: BLE001 - the reader's own message, in one sentence
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise TaskDataError(f"task.path={path} cannot be read as a data set ({type(err).__name__}: {first}).") from err
    return ds.to_list()


def to_prompts(records: list[dict[str, Any]], cfg: TaskConfig, where: str) -> tuple[list[Prompt], list[str]]:
    """Rows as Prompts, and one sentence per row that cannot be one (first MAX_ROW_PROBLEMS, then a count)."""
    rows: list[Prompt] = []
    bad: list[str] = []
    columns = ", ".join(records[0]) if records else ""
    for i, rec in enumerate(records):
        source = f"{where}:{i}"
        try:
            text = cfg.template.format_map(rec) if cfg.template else rec[cfg.prompt_key]
        except KeyError as err:
            key = err.args[0]
            setting = "task.template" if cfg.template else "task.prompt_key"
            bad.append(f"{source}: the row has no field {key!r} ({setting}); its fields are {columns}.")
            continue
        except (ValueError, IndexError) as err:
            bad.append(f"task.template cannot be filled ({err}); write fields as {{name}} and braces as {{{{ }}}}.")
            break
        if cfg.answer_key not in rec:
            bad.append(f"{source}: the row has no field {cfg.answer_key!r} (task.answer_key); its fields are {columns}.")
            continue
        if not isinstance(text, str):
            bad.append(f"{source}: the prompt field is a {type(text).__name__}, not text.")
            continue
        answer = reference_answer(str(rec[cfg.answer_key]), cfg.answer_format)
        if not answer:
            bad.append(f"{source}: no reference answer in {cfg.answer_key!r} for task.answer_format="
                       f"{cfg.answer_format.value} (GSM8K rows end with '#### <answer>', MATH rows hold \\boxed{{}}).")
            continue
        rows.append(Prompt(text, answer, source))
    if len(bad) > MAX_ROW_PROBLEMS:
        bad = bad[:MAX_ROW_PROBLEMS] + [f"... and {len(bad) - MAX_ROW_PROBLEMS} more rows like these."]
    if not records:
        bad.append(f"{where}: the data set has no rows.")
    return rows, bad


def read_dataset(cfg: TaskConfig) -> tuple[list[Prompt], list[Prompt], list[str]]:
    """(training rows, held-out rows, problems), every row of both read and checked."""
    if not cfg.path:
        raise TaskDataError("task=dataset needs task.path: a JSONL, JSON, Parquet or CSV file, or a folder of them.")
    records = _load(cfg.path, cfg.split)
    rows, bad = to_prompts(records, cfg, f"{Path(cfg.path).name}[{cfg.split}]")
    if cfg.eval_path:
        held, bad_eval = to_prompts(_load(cfg.eval_path, "train"), cfg, Path(cfg.eval_path).name)
        bad += bad_eval
    else:
        rows, held = split_held_out(rows, cfg.eval_fraction, cfg.seed)
    return rows, held, bad


class DatasetTask(RowTask):
    name = "dataset"
    libraries = ("datasets",)  # imported whole before set-up's threads start (see task_libraries)

    def __init__(self, cfg: TaskConfig, rows: tuple[list[Prompt], list[Prompt]] | None = None):
        """rows: (training rows, held-out rows) already read and checked (the validation pass reads them once)."""
        super().__init__(cfg)
        if rows is None:
            train, held, problems = read_dataset(cfg)
            if problems:
                raise TaskDataError(problems[0] + (f" ({len(problems) - 1} more problems)" if len(problems) > 1 else ""))
            rows = (train, held)
        self.rows, self.held_out = rows

    @classmethod
    def from_rows(cls, cfg: TaskConfig, rows: list[Prompt], held_out: list[Prompt]) -> DatasetTask:
        return cls(cfg, (rows, held_out))
