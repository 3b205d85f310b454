"""The checkpoint at the end of a run, or, where the disk has no room left for a whole one, the trained weights
alone. The run checks before its first step that its checkpoints fit (disk_space.check_run_fits); a disk that
filled since then would otherwise cost the trained weights at the last moment. The weights go to
<run dir>/final_model (a Hugging Face folder, written beside it and renamed into place), the run ends well, and a
sentence says that the optimizer state was not kept and what that means for resuming."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from rlgen.durable import disk_full
from rlgen.folder_bytes import unpack_into
from rlgen.plan.checks.disk_room import needed_with_headroom, size_text
from rlgen.runtime.cluster.waits import LearnerLost, short
from rlgen.runtime.durability.checkpoint import expected_bytes, finish_background, save
from rlgen.runtime.durability.checkpoint_folder import CHECKPOINTS, FINAL_MODEL, newest_checkpoint
from rlgen.runtime.durability.disk_space import DiskFull, folder_bytes, free_space
from rlgen.runtime.errors import RunError, WriteStopped

if TYPE_CHECKING:
    from rlgen.runtime.run_handle import Run


def save_final(run: Run) -> Path | None:
    """Checkpoint step_<steps> and its path. Where the disk has no room for it, the trained weights alone in
    final_model/ instead (run.state.weights_only, with the sentence saying so in run.state.weights_only_note)
    and None; where they do not fit either, DiskFull."""
    finish_background(run)  # a checkpoint still being written takes its room first
    root = run.out_dir / CHECKPOINTS
    small = run.plan.disk.small_bytes
    free, need = free_space(root, expected_bytes(run), small)
    if free >= need:
        return save(run, "final")
    weights_need = needed_with_headroom(_weights_bytes(run), small)
    if free < weights_need:
        raise DiskFull(f"{root} has {size_text(free)} free but a checkpoint needs about {size_text(need)} (the "
                       f"final one), and the trained weights alone about {size_text(weights_need)}; free some space "
                       "on that disk.", path=root, free=free, need=weights_need)
    path = _save_weights(run)
    run.state.weights_only = path
    run.state.weights_only_note = _note(run, path, root, free, need)
    return None


def _weights_bytes(run: Run) -> int:
    """What the trained weights take: the newest checkpoint's model folder, or the plan's estimate; with
    final_model/merged beside them where the run writes one."""
    last = newest_checkpoint(run.out_dir)
    model = folder_bytes(last / "model") if last is not None else run.plan.disk.model_bytes
    return model + run.plan.disk.merged_bytes


def _save_weights(run: Run) -> Path:
    """The policy alone (no optimizer state) as a Hugging Face folder at <run dir>/final_model, with its tokenizer:
    written into a folder beside it, then renamed into place."""
    final = run.out_dir / FINAL_MODEL
    tmp = run.out_dir / f".{FINAL_MODEL}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _fill_weights(run, tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except LearnerLost:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except (OSError, RunError) as err:  # here, or in a learner (whose error carries its own)
        shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full(err) is not None or "No space left" in str(err)
        why, fix = ("the disk is full", "free space on that disk") if full else (short(err), "make it writable")
        raise WriteStopped(f"the trained weights could not be written to {final} ({why}); {fix}.") from err
    return final


def _fill_weights(run: Run, folder: Path) -> None:
    """Every learner rank asked (gathering the weights may be a collective); rank 0 writes the folder, or sends it
    back packed from a node that cannot write into the run directory."""
    built = run.built
    here = [built.folders.writes_here.get(n, True) for n in built.folders.learner_nodes]
    refs = [a.save_model.remote(str(folder)) if ok else a.save_model_packed.remote()
            for a, ok in zip(built.learners, here)]
    out = run.learner_group.wait(refs, "writing the trained weights", hang=False)
    if not here[0]:
        folder.mkdir(parents=True, exist_ok=True)
        unpack_into(out[0], str(folder))
    built.tokenizer.save_pretrained(str(folder))


def _note(run: Run, path: Path, root: Path, free: int, need: int) -> str:
    """The sentence for a run that kept its weights only: why, where they are, and what resuming can do."""
    last = newest_checkpoint(run.out_dir)
    then = (f"resume= continues from {last.name}, not from step {run.state.step}" if last is not None else
            "the run cannot be resumed")
    start = "learner.lora.init" if run.cfg.learner.lora.enabled else "model.path"  # with LoRA they are the adapters
    return (f"the final checkpoint did not fit ({root} has {size_text(free)} free and it needs about "
            f"{size_text(need)}), so the trained weights alone are saved in {path} ({size_text(folder_bytes(path))}), "
            f"without the optimizer state: {then}, and training them further is a new run from them ({start}={path}) "
            "with a fresh optimizer; to keep whole checkpoints, free space on that disk or point the run directory "
            "at a larger one (hydra.run.dir=<folder>).")


__all__ = ["save_final"]
