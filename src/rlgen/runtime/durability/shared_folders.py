"""Folders that actors on other nodes must read (the model, a checkpoint to resume) or write (checkpoints).

``ray.share=path``: every node reads the driver's path (a shared file system). ``object_store``: a folder is
packed once, put in Ray's object store, and unpacked on each other node under its temp dir; checkpoints
come back the same way. ``auto`` (the default) probes each node: a node that sees the same folder (same
files, same sizes, same config.json) reads it in place, the others get it shipped.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rlgen.config import ShareMode
from rlgen.folder_bytes import fingerprint, pack, unpack

if TYPE_CHECKING:
    from ray import ObjectRef

    from rlgen.config import RunConfig
    from rlgen.plan.placement import Placement

T = TypeVar("T")

SHIPPED_DIR = "rlgen-shipped"  # under each node's temp dir


def _on_node(node_id: str, fn: Callable[..., T], *args: object) -> ObjectRef[T]:
    """A ref to fn(*args) run on that node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(fn).options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
                                  ).remote(*args)


def _materialize(data: bytes, key: str) -> str:
    return unpack(data, str(Path(tempfile.gettempdir()) / SHIPPED_DIR / key))


def place_folder(folder: str, node_ids: list[str], mode: ShareMode, timeout_s: float) -> dict[str, str]:
    """The path each node reads ``folder`` at: the folder itself where the node sees it, else a copy shipped
    through the object store (cached under the node's temp dir by the folder's fingerprint)."""
    import ray

    nodes = list(dict.fromkeys(node_ids))
    here = fingerprint(folder)
    if mode is ShareMode.path or here is None:
        return {n: folder for n in nodes}
    local = ray.get_runtime_context().get_node_id()
    visible = {n: n == local for n in nodes}  # the driver's own node reads its folder in place
    others = [n for n in nodes if n != local]
    if mode is ShareMode.auto and others:
        seen = ray.get([_on_node(n, fingerprint, folder) for n in others], timeout=timeout_s)
        visible.update({n: f == here for n, f in zip(others, seen)})
    paths = {n: folder for n in nodes if visible[n]}
    missing = [n for n in nodes if not visible[n]]
    if missing:
        ref = ray.put(pack(folder))
        key = f"{Path(folder).name}-{here[:16]}"
        got = ray.get([_on_node(n, _materialize, ref, key) for n in missing], timeout=timeout_s)
        paths.update(zip(missing, got))
    return paths


def sees_run_dir(run_dir: str, node_ids: list[str], mode: ShareMode, timeout_s: float) -> dict[str, bool]:
    """Whether each node writes into the driver's run directory (a shared file system): a marker file the
    driver wrote must be visible there. object_store: only the driver's own node does."""
    import ray

    nodes = list(dict.fromkeys(node_ids))
    if mode is ShareMode.path:
        return {n: True for n in nodes}
    local = ray.get_runtime_context().get_node_id()
    result = {n: n == local for n in nodes}
    others = [n for n in nodes if n != local]
    if mode is ShareMode.object_store or not others:
        return result
    marker = Path(run_dir) / f".rlgen-node-probe-{os.getpid()}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(marker.name)
    try:
        seen = ray.get([_on_node(n, _reads, str(marker), marker.name) for n in others], timeout=timeout_s)
    finally:
        marker.unlink(missing_ok=True)
    result.update(zip(others, seen))
    return result


def _reads(path: str, text: str) -> bool:
    try:
        return Path(path).read_text() == text
    except OSError:
        return False


@dataclass
class RunFolders:
    """Where each node's actors read what they start from, and which learner nodes write the run directory."""

    engine_paths: dict[str, str]  # node -> the model folder engines there load
    learner_paths: dict[str, str]  # node -> the model folder learners there load
    learner_nodes: list[str]  # the node of each learner rank
    writes_here: dict[str, bool]  # learner node -> it can write checkpoints into the run directory
    # resume_from, ref_model_path, teacher_path: each by node
    learner_extra: dict[str, dict[str, str]] = field(default_factory=dict)


def place_run_folders(cfg: RunConfig, node_ids: list[str], placement: Placement, model: str, run_dir: Path,
                      initial_model: str, checkpoint: Path | None = None, teacher: str | None = None) -> RunFolders:
    """The model (a resumed run: the checkpoint's, and the whole checkpoint for the learners; the initial model
    as the reference when algo.kl_coef > 0; the teacher's folder under on-policy distillation) placed on every
    node that runs an actor."""
    mode, t = ShareMode(cfg.ray.share), cfg.startup_timeout_s
    engine_nodes = [node_ids[ap.group] for ap in placement.engines]
    learner_nodes = [node_ids[ap.group] for ap in placement.learners]
    folders = RunFolders(place_folder(model, engine_nodes, mode, t), {}, learner_nodes,
                         sees_run_dir(str(run_dir), learner_nodes, mode, t))
    if teacher:
        folders.learner_extra["teacher_path"] = place_folder(teacher, learner_nodes, mode, t)
    lora = cfg.learner.lora
    if checkpoint is not None:
        ckpt = place_folder(str(checkpoint), learner_nodes, mode, t)
        folders.learner_extra["resume_from"] = ckpt
        if lora.enabled:  # the base, and the checkpoint's model folder holds the adapter
            folders.learner_paths = place_folder(initial_model, learner_nodes, mode, t)
            return folders
        folders.learner_paths = {n: str(Path(p) / "model") for n, p in ckpt.items()}
        if cfg.algo.kl_coef > 0:
            folders.learner_extra["ref_model_path"] = place_folder(initial_model, learner_nodes, mode, t)
    else:
        folders.learner_paths = place_folder(model, learner_nodes, mode, t)
        if lora.enabled and lora.init:
            folders.learner_extra["lora_init"] = place_folder(str(Path(lora.init).expanduser()), learner_nodes, mode, t)
    return folders
