"""What a run writes to disk, as the plan predicts it: each checkpoint (the policy's folder and the learner's
state), how many checkpoints the run writes and how many are on disk at once, final_model/merged (LoRA with
learner.lora.save_merged), and the preset model built into cache_dir. Pure arithmetic on the model's size: no
torch. ``rlgen plan`` shows it; plan.checks.disk_room holds it against the free space before a run starts.

final_model/ is hard links into the last checkpoint's model/ (no second copy); metrics, status, logs and the
reports are small beside a checkpoint (``small_bytes``), and the free-space checks keep headroom for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlgen.config import LearnerKind, RunConfig
from rlgen.plan.memory import longest_sequence

# Bytes per parameter. The policy's folder: fp32 from the torch learner, bf16 gathered from DeepSpeed. The learner's
# state: AdamW's two fp32 moments, and under DeepSpeed its own bf16 module and the fp32 master weights.
MODEL_FOLDER_BYTES = {LearnerKind.torch: 4, LearnerKind.deepspeed: 2}
LEARNER_STATE_BYTES = {LearnerKind.torch: 8, LearnerKind.deepspeed: 2 + 12}
BUILT_BYTES = {True: 2, False: 4}  # a preset built here: bf16 with a full vocabulary, else fp32 (models.build)
# The run's own small files. Once: plan.json, Hydra's files, summary.json, the three PNG reports and run.log's
# start-up lines (about 200 KB on CPU, more with engines' logs). Each step: its metrics.jsonl line (about 3 KB with
# one engine, a span more per actor and phase), its run.log lines and status.json written again beside itself.
# Each checkpoint on disk: state.json and rng.json (about 30 KB), and rollouts.json's responses generated ahead.
SMALL_FIXED_BYTES = 4 * 2**20
SMALL_STEP_BYTES = 16 * 2**10
SMALL_CHECKPOINT_BYTES = 64 * 2**10
ROLLOUT_TOKEN_BYTES = 48  # a token of a response kept in rollouts.json: its id and logprob as JSON text


@dataclass(frozen=True)
class DiskWrites:
    """What a new run writes, in bytes: one checkpoint's parts, how many checkpoints, and the rest of size."""

    model_bytes: int  # a checkpoint's model/: the policy as a Hugging Face folder (with LoRA: the adapters)
    learner_bytes: int  # a checkpoint's learner/: each rank's optimizer state (DeepSpeed: and master weights)
    merged_bytes: int = 0  # final_model/merged: the base with the adapters merged in (learner.lora.save_merged)
    build_bytes: int = 0  # the preset model built into cache_dir when it is not built yet (0 with model.path)
    checkpoints: int = 1  # checkpoints a new run writes: every checkpoint.every steps, and one at the end
    at_once: int = 1  # the most on disk at once: the newest checkpoint.keep, and the one being written
    small_bytes: int = SMALL_FIXED_BYTES  # the run's own small files: metrics, status, logs, reports (small_files)

    @property
    def checkpoint_bytes(self) -> int:
        return self.model_bytes + self.learner_bytes

    @property
    def run_dir_bytes(self) -> int:
        """The most a new run holds under its run directory at once: its checkpoints and final_model/merged."""
        return self.at_once * self.checkpoint_bytes + self.merged_bytes


def checkpoints_written(every: int, steps: int, start: int = 0) -> int:
    """Checkpoints a run from step ``start`` to ``steps`` writes: one after each step k < steps that
    checkpoint.every divides (none with every=0), and the final one."""
    periodic = (steps - 1) // every - start // every if every > 0 and steps > start else 0
    return max(0, periodic) + 1


def checkpoints_at_once(keep: int, written: int, existing: int = 0, pinned: bool = False) -> int:
    """The most checkpoints on disk at once while a run writes ``written`` more, the one being written included
    (``existing``: complete ones there already). Older ones go only once a new one is complete: the first is
    written beside every existing one, each later one beside the newest ``keep``. A resumed run (``pinned``) also
    keeps the one it started from, the newest existing, which falls out of the newest ``keep`` once more than
    ``keep`` new ones are written (runtime.durability.checkpoint)."""
    if written <= 0:
        return existing
    keep = max(keep, 1)
    last = min(keep, existing + written - 1) + int(pinned and written > keep)
    return max(existing, last) + 1


def small_files(cfg: RunConfig, at_once: int) -> int:
    """What the run's own small files take at the most: the fixed ones, a few KB a step, and each checkpoint's
    own (its state, and the responses generated ahead of the learner that it keeps: algo.async_steps batches,
    and algo.partial_rollouts' share carried)."""
    a = cfg.algo
    ahead = (a.async_steps or 0) + a.partial_rollouts
    rollouts = ahead * a.prompts_per_step * a.samples_per_prompt * longest_sequence(cfg) * ROLLOUT_TOKEN_BYTES
    return int(SMALL_FIXED_BYTES + cfg.steps * SMALL_STEP_BYTES + at_once * (SMALL_CHECKPOINT_BYTES + rollouts))


def disk_writes(cfg: RunConfig, params: int, learner: LearnerKind, adapters: int = 0) -> DiskWrites:
    """What a new run of cfg writes (params: the model's; adapters: LoRA's trainable parameters, 0 without)."""
    c, m = cfg.checkpoint, cfg.model
    trained = adapters or params
    written = checkpoints_written(c.every, cfg.steps)
    at_once = checkpoints_at_once(c.keep, written)
    lora = cfg.learner.lora
    return DiskWrites(
        model_bytes=trained * MODEL_FOLDER_BYTES[learner],
        learner_bytes=trained * LEARNER_STATE_BYTES[learner],
        merged_bytes=params * MODEL_FOLDER_BYTES[learner] if lora.enabled and lora.save_merged else 0,
        build_bytes=0 if m.path else params * BUILT_BYTES[m.vocab_size > 0],
        checkpoints=written,
        at_once=at_once,
        small_bytes=small_files(cfg, at_once),
    )


__all__ = ["DiskWrites", "checkpoints_at_once", "checkpoints_written", "disk_writes", "small_files"]
