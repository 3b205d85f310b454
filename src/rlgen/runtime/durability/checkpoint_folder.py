"""Checkpoint folders: ``<run dir>/checkpoints/step_<k>/`` holds everything needed to run step k next.

``model/`` (the policy as a Hugging Face folder), ``learner/`` (each rank's optimizer state, counters and RNG
states), ``state.json`` (the run state and config), ``rollouts.json`` (rollouts generated ahead), ``rng.json``
(the driver's RNG states) and ``COMPLETE``, written last. A checkpoint is written into a temporary folder and
renamed into place, so a folder without ``COMPLETE`` is torn and never resumed from. docs/durability.md has
the layout file by file.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlgen.types import JSONDict

CHECKPOINTS = "checkpoints"
FINAL_MODEL = "final_model"  # <run dir>/final_model: the trained policy, where a user looks for it
MARKER = "COMPLETE"
STATE_FILE = "state.json"
ROLLOUTS_FILE = "rollouts.json"
RNG_FILE = "rng.json"
FORMAT = 1
_NAME = re.compile(r"^step_(\d{6,})$")

CONTENTS = {
    "model": "the policy as a Hugging Face folder (weights, config, tokenizer)",
    "learner": "each learner rank's optimizer state, counters and RNG states",
    STATE_FILE: "step, version, data cursor, metrics line count, breaker state and the run's config",
    ROLLOUTS_FILE: "rollouts generated ahead of the learner, reused on resume",
    RNG_FILE: "the driver's RNG states",
}


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_step(path: Path) -> int | None:
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file() and (path / STATE_FILE).is_file()


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest step first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is not None and is_complete(p)]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def torn_checkpoints(run_dir: str | Path) -> list[Path]:
    """step_<k> folders without their marker, and temporary folders left by an interrupted write."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.iterdir()
        if p.is_dir() and ((checkpoint_step(p) is not None and not is_complete(p)) or p.name.startswith(".step_"))
    )


def newest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def read_state(checkpoint: str | Path) -> JSONDict:
    return json.loads((Path(checkpoint) / STATE_FILE).read_text())


def read_rollouts(checkpoint: str | Path) -> JSONDict:
    path = Path(checkpoint) / ROLLOUTS_FILE
    return json.loads(path.read_text()) if path.is_file() else {"flights": []}


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, data: JSONDict) -> None:
    with open(path, "w") as f:
        f.write(json.dumps(data, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def begin_checkpoint(run_dir: str | Path, step: int) -> Path:
    """The temporary folder checkpoint ``step`` is written into, beside the checkpoints (its name starts with a
    dot, so nothing takes it for a checkpoint)."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{checkpoint_name(step)}.tmp-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir()
    return tmp


def finish_checkpoint(run_dir: str | Path, step: int, tmp: Path, state: JSONDict, rollouts: JSONDict,
                      keep: int, pinned: Sequence[str | Path] = ()) -> Path:
    """The state files and the marker into ``tmp`` (which holds the learners' files), renamed into place; then
    the newest ``keep`` complete checkpoints stay (and the ``pinned`` ones) and torn ones go. On failure ``tmp``
    is removed and the checkpoints already there are untouched."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / checkpoint_name(step)
    try:
        _write(tmp / STATE_FILE, {"format": FORMAT, "contents": CONTENTS, **state})
        _write(tmp / ROLLOUTS_FILE, rollouts)
        _write(tmp / RNG_FILE, capture_rng())
        _write(tmp / MARKER, {"step": step, "written": time.time()})
        if final.exists():  # a torn folder of the same step, or an older write of it: replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(run_dir, keep, pinned)
    return final


def write_checkpoint(
    run_dir: str | Path,
    step: int,
    fill: Callable[[Path], None],
    state: JSONDict,
    rollouts: JSONDict,
    keep: int,
) -> Path:
    """Write checkpoint ``step``: ``fill(tmp)`` writes the model and learner files into a temporary folder,
    then the state files and the marker go in and the folder is renamed into place. Keeps the newest
    ``keep`` complete checkpoints and removes torn ones. Returns the checkpoint's path."""
    tmp = begin_checkpoint(run_dir, step)
    try:
        fill(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return finish_checkpoint(run_dir, step, tmp, state, rollouts, keep)


def run_state(*, step: int, steps: int, version: int, async_steps: int, metrics_lines: int, prompts_per_step: int,
              ahead: list[int], restarts: int, breaker: JSONDict, initial_model_path: str, wall_s: float,
              reason: str, identity: JSONDict) -> JSONDict:
    """state.json of a checkpoint taken after ``step`` steps (identity: the config, learner ranks and task file
    digest that a resume is checked against)."""
    return {
        "step": step,
        "steps": steps,
        "version": version,
        "async_steps": async_steps,
        "metrics_lines": metrics_lines,
        "data_cursor": {"next_step": step, "prompts_per_step": prompts_per_step,
                        "prompts_consumed": step * prompts_per_step, "generated_ahead": ahead},
        "engines": "sampling is seeded per step (seed * 100003 + step); engines keep no RNG state",
        "engine_restarts": restarts,
        "breaker": breaker,
        "initial_model_path": initial_model_path,
        "wall_s": wall_s,
        "reason": reason,
        "created": time.time(),
        **identity,
    }


def prune(run_dir: str | Path, keep: int, pinned: Sequence[str | Path] = ()) -> list[Path]:
    """Remove all but the newest ``keep`` complete checkpoints and the ``pinned`` ones (a resumed run's engines
    start from its checkpoint), and every torn one. Returns what it removed."""
    complete = list_checkpoints(run_dir)
    held = {Path(p).resolve() for p in pinned}
    older = complete[: max(0, len(complete) - max(keep, 1))]
    doomed = [p for p in older if Path(p).resolve() not in held] + torn_checkpoints(run_dir)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def final_model_from(checkpoint: Path, run_dir: Path) -> Path:
    """run_dir/final_model: the checkpoint's policy folder, hard-linked (no second copy on disk)."""
    path = Path(run_dir) / FINAL_MODEL
    if path.exists():
        shutil.rmtree(path)
    link_tree(Path(checkpoint) / "model", path)
    return path


def link_tree(src: Path, dst: Path) -> None:
    """A copy of folder ``src`` at ``dst`` made of hard links where the file system allows (no extra disk)."""
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link, dirs_exist_ok=True)


# -- the driver's RNG states -------------------------------------------------------------------------------
def capture_rng() -> JSONDict:
    """Python's, NumPy's (when imported) and torch's (when imported) global RNG states, as JSON values."""

    state: JSONDict = {"python": _jsonable(random.getstate())}
    if "numpy" in sys.modules:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    if "torch" in sys.modules:
        import torch

        state["torch"] = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
    return state


def restore_rng(state: JSONDict) -> None:
    random.setstate(_tupled(state["python"]))
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "torch" in state:
        import torch

        raw = base64.b64decode(state["torch"])
        torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))


def _jsonable(x: object) -> object:
    return [_jsonable(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tupled(x: object) -> object:
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x
