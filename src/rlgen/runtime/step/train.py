"""Train: one optimizer step of the learner group, each rank on its shard of the batch's rows. One metrics dict
comes back and every rank's spans go on the timeline; a learner out of GPU memory ends the run with one sentence
saying what to lower. While the ranks train, the next flight's rollouts are prepared and scored if they are in."""

from __future__ import annotations

from dataclasses import dataclass

from rlgen.errors import causes
from rlgen.learners.group import merge_results
from rlgen.plan.memory import response_bound
from rlgen.runtime.cluster.waits import LearnerLost
from rlgen.runtime.errors import RunError
from rlgen.runtime.run_handle import Run
from rlgen.runtime.step.advantages import Batch
from rlgen.types import JSONDict, StepResult, StepTimeline


@dataclass
class Trained:
    """The learner group's step: its result (rlgen.learners.group.merge_results: the version after it, whether it
    was skipped and why) and the metrics the step record logs (the result's record: loss, mismatch/*, ..., version,
    skipped), then the advantages phase's KL ones."""

    result: StepResult
    metrics: JSONDict


def train_batch(run: Run, step: int, batch: Batch, tl: StepTimeline) -> Trained:
    """Each rank's train_step on its shard; the ranks' RNG digests are kept (a survivor may stand in for a rank
    later) and their spans go on the timeline."""
    group = run.learner_group
    refs = group.ask("train_step", batch.shards)
    run.built.rollouts.prefetch()
    try:
        per_rank = group.wait(refs, f"training step {step}")
    except LearnerLost:
        raise
    except RunError as err:
        if out_of_memory(err):
            raise RunError(_oom_sentence(run, step)) from err
        raise
    for rank, r in enumerate(per_rank):  # each rank's RNG after the step: a survivor may stand in for it later
        if r.rng_digest is not None:
            run.state.rank_rng[rank] = (step + 1, r.rng_digest)
        tl.add_spans(f"learner{rank}", r.spans)
    result = merge_results(group.leads(per_rank))
    return Trained(result, {**result.record(), **batch.metrics})


def out_of_memory(err: BaseException) -> bool:
    """Whether a learner's failure was running out of GPU memory (torch's OutOfMemoryError, by name)."""
    return any(type(e).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(e).split("\n", 1)[0]
               for e in causes(err))


def _oom_sentence(run: Run, step: int) -> str:
    cfg, b = run.cfg, run.plan.batch
    tokens = cfg.algo.micro_batch_tokens
    budget = f"micro-batches of up to {tokens} packed tokens" if tokens else \
        f"each rank's {b.sequences_per_rank} sequences in one micro-batch"
    fixes = [f"lower algo.micro_batch_tokens (now {tokens or 'the whole shard'}; a row of {b.max_seq_len} tokens must "
             "fit)"]
    if not cfg.learner.gradient_checkpointing:
        fixes.append("set learner.gradient_checkpointing=true")
    name, bound = response_bound(cfg)
    fixes.append(f"lower {name} (now {bound})")
    return (f"training step {step} ran out of GPU memory on the learner ({budget}); " + ", ".join(fixes[:-1]) +
            f", or {fixes[-1]}. The last checkpoint is kept, and resume=auto with a smaller micro-batch or gradient "
            "checkpointing continues from it.")


__all__ = ["Trained", "out_of_memory", "train_batch"]
