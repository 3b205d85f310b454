"""Which run and checkpoint ``resume=`` continues, and whether the config still fits it.

``resume=<run dir>`` continues from that run's newest complete checkpoint (or from the ``step_<k>`` folder it
names); ``resume=auto`` continues the newest run under the output root whose checkpoint was trained with the
same math, or starts a new one. A resume that leaves no step to train is refused. Settings that change the math
must match the checkpoint's; anything else may change, and the changes are listed. docs/durability.md says
which settings are which.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rlgen.config import RunConfig, plain
from rlgen.errors import UserError
from rlgen.models import file_digest
from rlgen.runtime.durability.checkpoint_folder import (
    CHECKPOINTS,
    MARKER,
    STATE_FILE,
    checkpoint_step,
    is_complete,
    list_checkpoints,
    read_state,
    torn_checkpoints,
)
from rlgen.runtime.durability.run_folder import held_run
from rlgen.types import JSONDict, JSONValue

MATH_PREFIXES = ("model.", "algo.", "task.", "learner.")
MATH_KEYS = ("seed", "learner_ranks", "task_digest")
# Keys under those prefixes that change only memory or speed, not the math: micro-batches accumulate to the same
# gradient, gradient checkpointing recomputes the same activations, and every packed-attention backend computes the
# same attention. A run that ran out of memory resumes with them changed. (algo.micro_batch_size: the row count of
# checkpoints from before micro-batches were packed.)
MEMORY_KEYS = ("algo.micro_batch_tokens", "algo.micro_batch_size", "learner.gradient_checkpointing",
               "learner.attention")
IGNORED = ("resume", "existing_run")
Changes = dict[str, tuple[JSONValue, JSONValue]]  # key -> (its value in the checkpoint, its value now)
SEARCH_DEPTH = 4  # levels under the output root: outputs/<date>/<time>, multirun/<date>/<time>/<job>


class ResumeError(UserError, ValueError):
    """resume= cannot be honoured; the message says why and what to do."""


@dataclass
class ResumePoint:
    run_dir: Path
    checkpoint: Path
    state: JSONDict
    changes: Changes = field(default_factory=dict)  # safe keys that differ: old, new
    skipped_torn: list[Path] = field(default_factory=list)

    @property
    def step(self) -> int:
        return int(self.state["step"])


def identity(cfg: RunConfig, learner_ranks: int) -> JSONDict:
    """What a checkpoint records to compare a later config with: the config, the learner ranks and the digest
    of the task's data file."""

    path = cfg.task.path
    digest = file_digest(path) if path and Path(path).expanduser().is_file() else None
    return {"config": plain(cfg), "learner_ranks": int(learner_ranks), "task_digest": digest}


def _flatten(d: JSONDict, prefix: str = "") -> JSONDict:
    out: JSONDict = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and k != "env":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changes(saved: JSONDict, current: JSONDict) -> Changes:
    """Keys whose values differ between two identities: {key: (saved, current)}. A key the saved identity lacks
    (a setting newer than its checkpoint) is no change where the current config holds its default."""
    a = {**_flatten(saved.get("config", {})), "learner_ranks": saved.get("learner_ranks"),
         "task_digest": saved.get("task_digest")}
    b = {**_flatten(current["config"]), "learner_ranks": current["learner_ranks"], "task_digest": current["task_digest"]}
    defaults = _defaults()
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if k not in IGNORED and a.get(k) != b.get(k)
            and not (k not in a and k in defaults and b.get(k) == defaults[k])}


def _defaults() -> JSONDict:
    """Every key of the schema with its default, flattened as identities are."""
    return _flatten(plain(RunConfig()))


def math_keys(diff: Changes) -> list[str]:
    return [k for k in diff if k in MATH_KEYS or (k.startswith(MATH_PREFIXES) and k not in MEMORY_KEYS)]


def _describe(key: str, old: JSONValue, new: JSONValue) -> str:
    if key == "task_digest":
        return "the contents of task.path"
    if key == "learner_ranks":
        return f"the number of learner ranks ({old} -> {new})"
    return f"{key} ({old} -> {new})"


def refusal(run_dir: Path, diff: Changes) -> str:
    keys = math_keys(diff)
    what = ", ".join(_describe(k, *diff[k]) for k in keys)
    return (
        f"resume={run_dir}: the checkpoint was trained with different {what}, which change the math; resume "
        "with the checkpoint's values, or drop resume= to start a new run."
    )


def _read(checkpoint: Path) -> tuple[JSONDict | None, str | None]:
    """(the checkpoint's state.json, None), or (None, why it cannot be read)."""
    try:
        state = read_state(checkpoint)
    except ValueError as err:  # cut short or changed: not JSON (or not text)
        at = f" at line {err.lineno} column {err.colno}" if isinstance(err, json.JSONDecodeError) else ""
        return None, f"is not valid JSON{at} (cut short, or changed)"
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return None, "holds no step"
    return state, None


def _state(checkpoint: Path, spec: str) -> JSONDict:
    """The checkpoint's state.json; ResumeError naming the file, and the older checkpoint to resume from instead,
    when it cannot be read."""
    state, why = _read(checkpoint)
    if state is not None:
        return state
    step = checkpoint_step(checkpoint) or 0
    older = [c for c in reversed(list_checkpoints(checkpoint.parent.parent)) if (checkpoint_step(c) or 0) < step]
    fallback = next((c for c in older if _read(c)[0] is not None), None)
    fix = (f"resume from the one before with {shlex.quote(f'resume={fallback}')}" if fallback else
           "the run has no older complete checkpoint; drop resume= to start a new run")
    raise ResumeError(f"resume={spec}: {checkpoint / STATE_FILE} {why}, so checkpoint {checkpoint.name} cannot be "
                      f"resumed; {fix}.")


def _point(run_dir: Path, current: JSONDict, spec: str,
           checkpoint: Path | None = None) -> tuple[ResumePoint | None, Changes]:
    """The point to resume run_dir from: checkpoint, or its newest complete one (None: it has none)."""
    if checkpoint is None:
        found = list_checkpoints(run_dir)
        if not found:
            return None, {}
        checkpoint = found[-1]
    state = _state(checkpoint, spec)
    diff = changes(state, current)
    point = ResumePoint(run_dir, checkpoint, state, {k: v for k, v in diff.items() if k not in math_keys(diff)},
                        torn_checkpoints(run_dir))
    return point, diff


def check_steps(point: ResumePoint, steps: int, spec: str) -> None:
    """A resume that leaves nothing to train is refused, with the steps that would train on."""
    what = f"the newest run with these settings, {point.run_dir}," if spec == "auto" else "its checkpoint"
    if point.step >= steps:
        raise ResumeError(f"resume={spec}: {what} is at step {point.step} already, so steps={steps} leaves "
                          f"nothing to train; set steps= above {point.step} (e.g. steps={2 * point.step}) to train it "
                          "further, or drop resume= to start a new run (in a folder that holds no run).")


def _checkpoint_folder(path: Path) -> bool:
    """Whether path is a checkpoint of a run (<run dir>/checkpoints/step_<k>)."""
    return checkpoint_step(path) is not None and path.parent.name == CHECKPOINTS


def _run_dir_of(path: Path) -> Path:
    """The run directory resume=<path> names: path, or the run a checkpoint folder belongs to."""
    return path.parent.parent if _checkpoint_folder(path) else path


def resolve_explicit(spec: str, current: JSONDict) -> ResumePoint:
    """resume=<run dir> (its newest complete checkpoint) or resume=<run dir>/checkpoints/step_<k> (that one)."""
    path = Path(spec).expanduser()
    if path.exists() and not path.is_dir():
        parent = path.parent
        hint = f" (the run directory it is in: resume={parent})" if (parent / CHECKPOINTS).is_dir() else ""
        raise ResumeError(f"resume={spec} is a file, not a run directory; give the folder a stopped run printed "
                          f"(it holds checkpoints/){hint}, or use resume=auto.")
    if not path.is_dir():
        raise ResumeError(
            f"resume={spec}: no such run directory; give the folder a stopped run printed (it holds "
            "checkpoints/), or use resume=auto."
        )
    if _checkpoint_folder(path) and not is_complete(path):
        raise ResumeError(f"resume={spec}: the checkpoint is torn (it has no {MARKER} marker); give its run "
                          f"directory, {path.parent.parent}, to resume from the newest complete one.")
    run_dir = _run_dir_of(path)
    point, diff = _point(run_dir, current, spec, path if _checkpoint_folder(path) else None)
    if point is None:
        torn = torn_checkpoints(run_dir)
        extra = f" ({len(torn)} torn checkpoint(s) without their COMPLETE marker were skipped)" if torn else ""
        raise ResumeError(
            f"resume={spec}: the run has no complete checkpoint to continue from{extra}; drop resume= to start "
            "a new run."
        )
    if math_keys(diff):
        raise ResumeError(refusal(run_dir, diff))
    check_steps(point, current["config"]["steps"], spec)
    return point


def candidates(run_dir: Path, search_root: Path | None) -> list[Path]:
    """This run's directory, then every run directory with checkpoints under the output root."""
    found = [run_dir]
    if search_root is not None and search_root.is_dir():
        for depth in range(1, SEARCH_DEPTH + 1):
            pattern = "/".join(["*"] * depth) + "/checkpoints"
            found += [p.parent for p in search_root.glob(pattern) if p.is_dir()]
    seen: set[Path] = set()
    unique = []
    for p in found:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def resolve_auto(run_dir: Path, search_root: Path | None, current: JSONDict) -> tuple[ResumePoint | None, str]:
    """The newest run with a compatible checkpoint, or None and a note saying why a new run starts."""
    fits: list[ResumePoint] = []
    misfits: list[tuple[ResumePoint, dict]] = []
    for d in candidates(run_dir, search_root):
        point, diff = _point(d, current, "auto")
        if point is None:
            continue
        (misfits.append((point, diff)) if math_keys(diff) else fits.append(point))
    if fits:
        point = max(fits, key=lambda p: (p.checkpoint.stat().st_mtime, p.step))
        check_steps(point, current["config"]["steps"], "auto")
        return point, ""
    if misfits:
        point, diff = max(misfits, key=lambda m: m[0].checkpoint.stat().st_mtime)
        what = ", ".join(_describe(k, *diff[k]) for k in math_keys(diff)[:4])
        return None, (
            f"resume=auto: no earlier run has these settings (the newest, {point.run_dir}, differs in {what}); "
            "starting a new run."
        )
    where = f" under {search_root}" if search_root is not None else ""
    return None, f"resume=auto: no earlier run with a checkpoint{where}; starting a new run."


def resume_clause(run_dir: Path, command: str | None) -> str:
    """How a run that stopped goes on, for the end of the sentence saying why it stopped: the command that resumes
    it (command: as rlgen train builds it; resume=<run dir> where none is given) and the checkpoint it continues
    from, or that it has no complete checkpoint yet, so running it again starts over (into the same folder, once
    it holds the run's metrics, with existing_run=replace)."""
    found = list_checkpoints(run_dir)
    if not found:
        again = " (with existing_run=replace, to run in this folder again)" if held_run(run_dir) is not None else ""
        return f"it has no checkpoint yet, so running it again starts from step 0{again}"
    how = command or f"resume={run_dir} and the same settings"
    return f"resume with: {how} (it continues from {found[-1].name})"


def search_root_from_hydra() -> Path | None:
    """The fixed prefix of hydra.run.dir (or hydra.sweep.dir in a multirun): where runs of this project live."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf

        hc = HydraConfig.get()
        node = hc.sweep if hc.mode == RunMode.MULTIRUN else hc.run
        pattern = str(OmegaConf.to_container(node, resolve=False)["dir"])
    except (ImportError, ValueError, KeyError):
        return None
    return search_root_of(pattern)


def search_root_of(pattern: str) -> Path:
    """Where resume=auto looks for runs, from hydra.run.dir's pattern: its fixed prefix, or the folder a fixed
    directory is in."""
    fixed = pattern.split("${", 1)[0].rstrip("/")
    if "${" not in pattern:  # a fixed directory: the runs beside it
        fixed = str(Path(pattern).parent)
    return Path(fixed or ".").expanduser()


def continues(folder: Path, resume: str | None, current: JSONDict, search_root: Path | None) -> tuple[bool, str]:
    """Whether a run with this resume= continues the run that folder holds; where it does not, a clause on why
    (for the sentence refusing to write there). Raises ResumeError as resolve_auto does."""
    if not resume:
        return False, ""
    if resume != "auto":
        target = _run_dir_of(Path(resume).expanduser())
        return target.resolve() == folder.resolve(), f" (resume={resume} continues another run)"
    point, _ = resolve_auto(folder, search_root, current)
    if point is not None:
        same = point.run_dir.resolve() == folder.resolve()
        return same, "" if same else f" (resume=auto would continue {point.run_dir} instead)"
    here, diff = _point(folder, current, "auto")
    keys = math_keys(diff) if here is not None else []
    what = ", ".join(_describe(k, *diff[k]) for k in keys[:4])
    return False, f" (this run's settings differ in {what}, which change the math)" if keys else ""
