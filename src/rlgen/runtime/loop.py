"""The GRPO loop over a set-up Run. One step: engines generate the step's rollouts (policy version v), the driver
scores them, the learner trains (v -> v+1), and the new weights go to the engines. Up to ``state.async_steps``
generations run ahead of the learner, so generation of step s+1 overlaps training of step s; 0 is strictly
on-policy. The engines' side (flights, collection, scoring, eval) is ``rlgen.runtime.rollouts.generation``.

A stop request, or an engine that dies too often, ends the loop with a checkpoint (RunStopped); so does a learner
rank that dies or hangs, from a surviving rank where it can (rlgen.runtime.durability.learner_loss)."""

from __future__ import annotations

import logging
import time
from typing import Any

from rich.markup import escape

from rlgen import launched_at
from rlgen.config import BreakerAction, KLPenalty
from rlgen.errors import causes
from rlgen.learners.group import merge_rank_metrics
from rlgen.metrics.balance import BalanceTracker, context_from_plan
from rlgen.plan.memory import response_bound
from rlgen.runtime.cluster.waits import LearnerLost
from rlgen.runtime.durability.checkpoint import save, stopped
from rlgen.runtime.durability.final_checkpoint import save_final
from rlgen.runtime.durability.learner_loss import WeightUpdateHung, learner_lost, update_hung
from rlgen.runtime.errors import RunError, StopRequested, WriteStopped
from rlgen.runtime.rollouts.engine_restarts import EngineLost
from rlgen.runtime.rollouts.in_flight import InFlight
from rlgen.runtime.rollouts.refill import step_rollouts
from rlgen.runtime.rollouts.tail import tail_metrics
from rlgen.runtime.setup import Run
from rlgen.runtime.step_record import step_record
from rlgen.sync.waits import SyncError, SyncTimeoutError
from rlgen.tasks.scoring import RewardError
from rlgen.types import Phase, StepTimeline

log = logging.getLogger(__name__)


def train(run: Run, sink: Any) -> dict:
    """Run steps state.step .. steps-1, checkpointing every checkpoint.every steps and at the end (where the disk
    has no room left for the last checkpoint, keeping the trained weights alone); returns the sink's summary."""

    cfg, state = run.cfg, run.state
    run.sink = sink
    tracker = BalanceTracker(context_from_plan(run.plan))
    for rec in sink.records:  # a resumed run: the verdict carries on from the steps already run
        tracker.update(rec)
    try:
        for step in range(state.step, cfg.steps):
            if run.stop.requested:
                raise StopRequested(f"step {step}")
            halt = _step(run, step, sink, tracker)
            if halt is not None:
                raise RunError(halt)
            every = cfg.checkpoint.every
            if every > 0 and state.step % every == 0 and state.step < cfg.steps:
                save(run, "every", background=bool(cfg.checkpoint.background))
        _finish_updates(run)
        save_final(run)  # or, where the disk has no room left for a checkpoint, the trained weights alone
    except StopRequested:
        raise stopped(run, run.stop.name, run.stop.exit_code, write=True) from None
    except EngineLost as err:
        raise stopped(run, str(err), 1, write=True) from err
    except LearnerLost as err:
        raise learner_lost(run, err) from err
    except WeightUpdateHung as err:
        raise update_hung(run, err) from err
    return sink.summary()


def _step(run: Run, step: int, sink: Any, tracker: Any) -> str | None:
    """One step; returns the breaker's halt message when it halts the run. The balance verdict goes in the step's
    record; its advice is said once, at the end of the run."""
    cfg, state = run.cfg, run.state
    t_step = time.time()
    tl = StepTimeline(step)
    batch, got, flight = _rollouts(run, step, tl)
    run.learners_ready()  # the first batch may have generated while the learners started
    scores = got.scores
    staleness = state.version - batch.version
    for r in _over_engines(run, run.transport.sleep_engines):  # colocated engines sleep while the learner trains
        for phase, a, b in r["spans"]:
            tl.add(r["actor"], Phase(phase), a, b)
    try:
        metrics = _train(run, batch, step, tl)
    except LearnerLost:  # the step runs again on resume, on these rollouts where they were generated ahead
        run.rollouts.put_back(flight)
        raise
    metrics.update(scores.means())
    metrics.update(got.metrics)
    _warn_rewards(run, step, got)
    event = state.breaker.update(step, metrics, batch)
    halt = event is not None and event.action is BreakerAction.halt
    if event is not None:
        sink.console.print(f"[yellow]breaker:[/] {escape(event.message)}", highlight=False)
        if event.action is BreakerAction.tighten:
            state.async_steps = 0
    _push(run, metrics, halt, tl)
    metrics.update(state.breaker.metrics())
    metrics["engine_restarts"] = run.keeper.total_restarts
    ro = run.rollouts
    if ro.eval_set and ((step + 1) % cfg.eval.every == 0 or step + 1 == cfg.steps):
        metrics.update(ro.evaluate(step, run.transport.version))
    rec = step_record(step, tl, batch, scores.totals, metrics, state.version, staleness, time.time() - t_step,
                      len(run.learners))
    verdict = tracker.update(rec)
    rec["balance"] = verdict.to_dict()
    state.step = step + 1
    try:
        sink.log(rec)
    except OSError as err:  # the line was not written (the file keeps its whole lines): say why, stop
        raise WriteStopped(str(err)) from err
    return event.message if halt else None


def _rollouts(run: Run, step: int, tl: StepTimeline) -> tuple[Any, Any, InFlight]:
    """The step's rollouts: launched (with those up to async_steps ahead), collected, scored, shaped and refilled
    (rlgen.runtime.rollouts.refill), and batched with the algorithm's advantages. Returns (batch, StepRollouts, flight)."""
    from rlgen.algo.loss import AdvantageShapeError
    from rlgen.runtime.rollouts.batch import build_batch

    ro, algo = run.rollouts, run.cfg.algo
    # The run's first batch generates alone: nothing trains meanwhile, and a batch launched ahead beside it would
    # share the engines' steps and delay it. Later batches go ahead at once, to generate while this one trains.
    ro.fill(step, run.state.async_steps if ro.collected else 0, run.transport.version)
    t0 = time.time()
    flight = ro.next_flight()
    ro.fill(step, run.state.async_steps, run.transport.version)
    tail = tail_metrics(flight, ro.ahead())
    run.startup.setdefault("first_rollout_s", time.time() - launched_at())
    if run.clock is not None:
        run.clock.first_batch()
    tl.add("learner0", Phase.wait, t0, time.time())
    _add_engine_spans(run, tl, flight)
    t0 = time.time()
    try:
        ro.prepare(flight)
        scores = ro.scorer.result(flight.scoring)
    except RewardError as err:
        raise RunError(str(err)) from err
    t1 = time.time()
    tl.add("driver", Phase.reward, t0, t1)
    got = step_rollouts(run, step, flight, scores, tl)
    got.metrics.update(tail)
    t0 = time.time() if got.metrics.get("dynamic/rounds", 1) > 1 else t1  # the extra rounds' scoring is inside them
    try:
        batch = build_batch(got.completions, got.rewards, run.pad_id,
                            lambda rewards, groups: run.algorithm.advantages(rewards, groups, algo),
                            mask_truncated=algo.mask_truncated)
    except AdvantageShapeError as err:
        raise RunError(f"algo.advantage={algo.advantage}: {err}") from err
    tl.add("driver", Phase.reward, t0, time.time())
    return batch, got, flight


def _warn_rewards(run: Run, step: int, got: Any) -> None:
    """Say when rewards came back NaN (they were given advantage 0), or dynamic sampling could not fill the batch."""
    nan = got.scores.nan_count
    if nan:
        run.sink.console.print(f"[yellow]reward:[/] step {step}: {nan} of {len(got.scores.totals)} rewards were NaN; "
                               "those completions get advantage 0 (reward/nan counts them).", highlight=False)
    errors = [c.env_error for c in got.completions if c.env_error]
    for c in got.completions:
        if c.env_error:
            log.info("step %d, group %d: the episode scored 0: %s", step, c.group_id, c.env_error)
    if errors and not run.rollouts.said_env_error:  # once per run; env/errors counts them every step
        run.rollouts.said_env_error = True
        run.sink.console.print(f"[yellow]environment:[/] step {step}: {len(errors)} episodes ended with an error and "
                               f"scored 0, the first: {escape(errors[0])} (env/errors counts them each step, "
                               "env/timeouts those whose call ran past task.env_timeout_s; run.log has each).",
                               highlight=False)
    want = run.cfg.algo.prompts_per_step
    kept = got.metrics.get("dynamic/groups_kept")
    if kept is not None and kept < want:
        run.sink.console.print(
            f"[yellow]dynamic sampling:[/] step {step} kept {kept:.0f} of {want} groups after "
            f"algo.max_gen_batches={run.cfg.algo.max_gen_batches} rounds (the others' rewards were all equal); it "
            "trained on those. Raise algo.max_gen_batches, or use a task whose prompts are neither all solved nor "
            "all failed.", highlight=False)


def _add_engine_spans(run: Run, tl: StepTimeline, flight: InFlight) -> None:
    for i, res in flight.results.items():
        for phase, a, b in res.spans:
            tl.add(run.engine_names[i], Phase(phase), a, b)
    for i, spans in flight.update_spans.items():
        for phase, a, b in spans:
            tl.add(run.engine_names[i], Phase(phase), a, b)


def _train(run: Run, batch: Any, step: int, tl: StepTimeline) -> dict:
    """One optimizer step of the learner group: each rank trains on its shard of the rows; one metrics dict
    comes back, every rank's spans go on the timeline. While it trains, the next flight's rollouts are prepared
    and scored if they are in."""

    assignment = _assignment(run, batch)
    shards = _shards(batch, assignment)
    penalty: dict[str, float] = {}
    algo = run.cfg.algo
    if algo.kl_coef > 0 and KLPenalty(algo.kl_penalty) is KLPenalty.reward:
        penalty = _kl_into_rewards(run, batch, shards, assignment, step)
        shards = _shards(batch, assignment)
    refs = [a.train_step.remote(b) for a, b in zip(run.learners, shards)]
    run.rollouts.prefetch()
    names = [f"learner{r}" for r in range(len(run.learners))]
    try:
        per_rank = run.waiter.learner_get(refs, f"training step {step}", names, run.folders.learner_nodes,
                                          hang_s=run.cfg.runtime.hang_timeout_s)
    except LearnerLost:
        raise
    except RunError as err:
        if out_of_memory(err):
            raise RunError(_oom_sentence(run, step)) from err
        raise
    for rank, m in enumerate(per_rank):  # each rank's RNG after the step: a survivor may stand in for it later
        if "rng_digest" in m:
            run.rank_rng[rank] = (step + 1, m.pop("rng_digest"))
    for rank, m in enumerate(per_rank):
        for phase, a, b in m.get("spans", []):
            tl.add(f"learner{rank}", Phase(phase), a, b)
    return {**merge_rank_metrics(per_rank), **penalty}


def _assignment(run: Run, batch: Any) -> Any:
    """Which rows each learner rank trains on, of equal estimated work, in micro-batches of at most
    algo.micro_batch_tokens packed tokens, as many on every rank (rlgen.microbatches)."""
    from rlgen.learners.packed import row_tokens
    from rlgen.microbatches import assign, attention_coef

    m = run.cfg.model
    tokens = row_tokens(batch.attention_mask, batch.response_mask, batch.prompt_len)
    return assign(tokens, len(run.learners), int(run.cfg.algo.micro_batch_tokens or 0),
                  attention_coef(m.num_layers, m.hidden_size, run.plan.model.params))


def _shards(batch: Any, assignment: Any) -> list[Any]:
    """Each learner rank's rows of the batch, with its micro-batches."""
    import torch

    shards = []
    for rank in range(len(assignment.ranks)):
        shard = batch.select(torch.tensor(assignment.rows(rank), dtype=torch.long))
        shard.micro_rows = assignment.local(rank)
        shards.append(shard)
    return shards


def _kl_into_rewards(run: Run, batch: Any, shards: list[Any], assignment: Any, step: int) -> dict[str, float]:
    """algo.kl_penalty=reward: the learners give each sequence's summed KL to the reference; kl_coef times it
    comes off the sequence's reward and the advantages are computed again, over the whole batch. Returns the
    step's kl (per response token) and the mean penalty."""
    import torch

    algo = run.cfg.algo
    names = [f"learner{r}" for r in range(len(run.learners))]
    refs = [a.sequence_kl.remote(b) for a, b in zip(run.learners, shards)]
    per_rank = run.waiter.learner_get(refs, f"the reference KL of step {step}", names, run.folders.learner_nodes)
    kl = torch.tensor(assignment.gather(per_rank), dtype=torch.float32)  # [N], the batch's row order
    batch.rewards = batch.rewards - algo.kl_coef * kl
    batch.advantages = run.algorithm.advantages(batch.rewards, batch.group_ids, algo)
    tokens = max(batch.num_response_tokens, 1)
    return {"kl": float(kl.sum()) / tokens, "kl_reward_penalty": float(algo.kl_coef * kl.mean())}


def _push(run: Run, metrics: dict, halt: bool, tl: StepTimeline) -> None:
    """The new version to the engines, unless the step was skipped or the breaker halts the run."""
    state = run.state
    if metrics.get("skipped"):
        _over_engines(run, run.transport.wake_engines)  # colocated: wake the engines on their old weights
        return
    state.version = int(metrics["version"])
    if halt:
        _over_engines(run, run.transport.wake_engines)
        return
    in_flight = state.async_steps > 0 and run.rollouts.ahead() is not None
    try:
        res = _over_engines(run, lambda: run.transport.push(state.version, in_flight=in_flight), resync=False)
    except SyncTimeoutError as err:
        cfg = run.cfg
        key = "runtime.hang_timeout_s" if cfg.runtime.hang_timeout_s <= cfg.timeout_s else "timeout_s"
        raise WeightUpdateHung(f"the weight update to version {state.version} did not finish within {key}="
                               f"{min(cfg.runtime.hang_timeout_s, cfg.timeout_s):g} ({err})") from err
    except SyncError as err:
        raise RunError(f"weight sync to version {state.version} failed: {err}") from err
    for r in res.results:
        for phase, a, b in r.get("spans", []):
            tl.add(r["actor"], Phase(phase), a, b)
        for part, seconds in r.get("parts", {}).items():  # where an update's time went, the slowest actor's
            metrics[f"sync_{part}_s"] = max(seconds, metrics.get(f"sync_{part}_s", 0.0))
    run.rollouts.queue_updates(res.pending)


def _over_engines(run: Run, call: Any, resync: bool = True) -> Any:
    """call() of the transport over every engine; when it failed because engines are gone (an actor, or the
    engine core inside one), they are re-created, and call() runs once more. resync: the new engines get the
    weights the engines had first; a push passes False, since its retry gives every engine the new ones (the
    learner holds only those)."""
    try:
        return call()
    except StopRequested:
        raise
    except Exception as err:
        if not run.keeper.replace_dead(err, resync):
            raise
    return call()


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


def _finish_updates(run: Run) -> None:
    """Surface any failure of the last weight update rather than dropping it."""
    from ray.exceptions import RayActorError

    for i, (inc, ref) in run.rollouts.take_queued_updates().items():
        try:
            run.waiter.get(ref, "final weight update", interruptible=False)
        except RunError as err:
            if not isinstance(err.__cause__, RayActorError):
                raise
            run.keeper.is_dead(i, inc, err.__cause__)


__all__ = ["train"]
