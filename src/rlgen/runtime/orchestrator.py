"""Plan -> Ray actors -> the GRPO loop. Reads top to bottom: setup(), train(), checkpoint(), cleanup().

One step: engines generate the step's rollouts (policy version v), the driver scores them, the learner trains
(v -> v+1), and the new weights go to the engines. Up to ``async_steps`` generations run ahead of the learner,
so generation of step s+1 overlaps training of step s; ``async_steps=0`` is strictly on-policy. The engines'
side (flights, collection, scoring, eval) is ``rlgen.runtime.rollouts``.

A run is a resumable value: a checkpoint (``rlgen.runtime.checkpoint``) holds the policy, the learner's
optimizer state, the step, the data cursor, the RNG states and the rollouts generated ahead, and
``resume=`` continues from it as if the run had never stopped. An engine that dies is re-created
(``rlgen.runtime.faults``); a stop signal ends the run at the next safe point with a checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rlgen import STARTED_AT
from rlgen.config import BreakerAction, RunConfig
from rlgen.plan import Plan
from rlgen.plan.placement import plan_bundles, start_waves
from rlgen.runtime.actors import (
    QUIET_ENV,
    ActorFactory,
    connect,
    engine_class,
    learner_class,
    ray_session_dir,
    release,
)
from rlgen.runtime.checkpoint import (
    checkpoint_name,
    final_model_from,
    is_complete,
    newest_checkpoint,
    run_state,
    write_checkpoint,
)
from rlgen.runtime.errors import RunError, RunStopped, StopRequested
from rlgen.runtime.faults import EngineKeeper, EngineLost
from rlgen.runtime.files import place_run_folders
from rlgen.runtime.flights import InFlight
from rlgen.runtime.monitor import CircuitBreaker
from rlgen.runtime.records import step_record
from rlgen.runtime.resume import ResumePoint, identity
from rlgen.runtime.rollouts import Rollouts
from rlgen.runtime.stop import StopFlag
from rlgen.runtime.transports import SyncError, make_transport
from rlgen.runtime.waits import LearnerLost, Waiter
from rlgen.types import Phase, StepTimeline

log = logging.getLogger(__name__)


class Orchestrator:
    def __init__(
        self,
        cfg: RunConfig,
        plan: Plan,
        out_dir: Path,
        *,
        engine_cls: type | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        learner_cls: type | None = None,
        resume: ResumePoint | None = None,
        stop: StopFlag | None = None,
        console: Console | None = None,
        status: Any = None,
    ):
        """engine_cls (with engine_kwargs) and learner_cls replace the classes the plan picks; tests inject
        faults with them. resume continues from a checkpoint; stop is the flag a signal sets (tests set it by
        hand); status (a RunStatus) is kept up to date with actors and checkpoints."""
        # the values the config left null (auto), as the plan resolved them: what every actor runs with
        self.cfg, self.plan, self.out_dir = plan.apply(cfg), plan, Path(out_dir)
        self._engine_cls, self._engine_kwargs, self._learner_cls = engine_cls, dict(engine_kwargs or {}), learner_cls
        self.resume, self.stop, self.status = resume, stop or StopFlag(), status
        self.console = console or Console()
        self.breaker = CircuitBreaker(cfg.monitor, self.out_dir)
        self.waiter = Waiter(cfg.timeout_s, self.stop, self.out_dir)
        self.engines: list[Any] = []
        self.engine_names: list[str] = []
        self.learner: Any = None  # rank 0: speaks for the learner group (weights, saving)
        self.learners: list[Any] = []  # every rank, rank 0 first
        self.folders: Any = None  # runtime.files.RunFolders: where each node reads the model, who writes checkpoints
        self.pgs: list[Any] = []
        self._started_ray = False
        self.async_steps = plan.async_steps  # resolved by the plan when the config left it null
        self.transport: Any = None
        self.keeper: EngineKeeper | None = None
        self.rollouts: Rollouts | None = None
        self.next_step = 0  # steps finished
        self.version = 0  # the learner's policy version; engines start with the same weights
        self.last_checkpoint: Path | None = resume.checkpoint if resume else None
        self.checkpoint_seconds: list[float] = []
        self.wall_before = float(resume.state.get("wall_s", 0.0)) if resume else 0.0
        self.sink: Any = None
        self.startup: dict[str, float] = {}  # setup_s, sync_warmup_s, first_rollout_s (from process start)

    @property
    def pending(self) -> Any:
        return self.rollouts.pending if self.rollouts else []

    # -- setup ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        from rlgen.models import load_tokenizer, prepare_model
        from rlgen.tasks import build_task
        from rlgen.tasks.prompts import PromptRenderer, model_stop_ids
        from rlgen.tasks.scoring import Scorer

        cfg, plan = self.cfg, self.plan
        t_setup = time.time()
        for var, val in QUIET_ENV.items():  # before transformers loads in this process (actors get them too)
            os.environ.setdefault(var, val)
        task = build_task(cfg.task)
        device = "cuda" if plan.device == "cuda" else "cpu"
        self.initial_model_path = prepare_model(cfg, device=device)
        # Actors start from the checkpoint's policy when resuming; the frozen reference stays the initial model.
        self.start_model_path = str(self.resume.checkpoint / "model") if self.resume else self.initial_model_path
        self.version = self.start_version = int(self.resume.state["version"]) if self.resume else 0
        self.tokenizer = load_tokenizer(self.start_model_path)
        renderer = PromptRenderer(self.tokenizer, cfg.task)
        if cfg.task.long_prompts.value == "skip" and hasattr(task, "keep_rows"):
            dropped = task.keep_rows(lambda p: renderer.fits(p.text))
            if dropped:
                self.console.print(f"left out {dropped} rows over task.max_prompt_tokens={cfg.task.max_prompt_tokens} "
                                   "(task.long_prompts=skip)", highlight=False)
        if hasattr(task, "rows"):
            self.console.print(f"task {task.name}: {len(task.rows)} rows, {len(task.eval_prompts())} held out; prompts "
                               f"as {renderer.format} text", highlight=False)
        stop_ids = model_stop_ids(self.start_model_path, self.tokenizer, cfg.task.stop_token_ids)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (stop_ids or [0])[0]

        self.placement = plan_bundles(plan)
        self._started_ray, self.node_ids, self.pgs = connect(cfg, plan, self.placement, self.stop, self.waiter)
        self.folders = place_run_folders(cfg, self.node_ids, self.placement, self.start_model_path, self.out_dir,
                                         self.initial_model_path, self.resume.checkpoint if self.resume else None)
        engine_cls, engine_kwargs = (self._engine_cls, dict(self._engine_kwargs)) if self._engine_cls else engine_class(cfg, plan)
        learner_cls, learner_kwargs = (self._learner_cls, {}) if self._learner_cls else learner_class(cfg, plan)
        self.factory = ActorFactory(cfg, plan, self.placement, self.pgs, self.node_ids, engine_cls, engine_kwargs,
                                    learner_cls, learner_kwargs)
        self.engine_names = [f"engine{s.index}" for s in plan.engines]
        rendezvous = None
        if len(self.placement.learners) > 1:
            rendezvous = self.waiter.get(self.factory.rendezvous_ref(), "finding the learner group's rendezvous",
                                         cfg.startup_timeout_s)
        self.learners = self.factory.learners(self.folders.learner_paths, rendezvous, **self.folders.learner_extra)
        self.learner = self.learners[0]
        health = self._start_engines(plan)
        bad = [h for h in health if not h.get("ok")]
        if bad:
            raise RunError(f"actors reported unhealthy at start-up: {bad}")
        self._note_actors(health)

        self.transport = make_transport(plan, cfg, bucket_mb=cfg.sync.bucket_mb, sleep_level=cfg.sync.sleep_level)
        self.transport.version = self.version
        # ZeRO-3 ranks other than 0 hold only shards: they join every gather while rank 0 sends
        gatherers = self.learners[1:] if learner_kwargs.get("zero_stage") == 3 else []
        try:
            self.transport.setup(self.learner, self.engines, self.engine_names, gatherers=gatherers)
            warm = self.transport.start()  # the first update's one-off costs, here rather than in step 0
        except SyncError as err:
            raise RunError(f"weight sync set-up failed: {err}") from err
        self.startup["sync_warmup_s"] = warm.seconds if warm else 0.0
        self.keeper = EngineKeeper(
            self.engines, self.engine_names, cfg.engine.max_restarts,
            create=lambda i: self.factory.engine(i, self.folders.engine_paths, self.start_version),
            ready=lambda actor, what: self._note_actors(self.waiter.get([actor.health.remote()], what,
                                                                        cfg.startup_timeout_s)),
            resync=self._resync_engine,
            say=lambda msg: self.console.print(f"[yellow]engine restart:[/] {escape(msg)}", highlight=False),
            node_of=self.factory.engine_node,
        )
        self.rollouts = Rollouts(cfg, task, self.tokenizer, renderer, stop_ids, self.keeper,
                                 Scorer(task.rewards, cfg.task, cfg.task.reward), self.stop)
        if self.resume:
            self._restore(self.resume)
        self.startup["setup_s"] = time.time() - t_setup

    def _start_engines(self, plan: Plan) -> list[dict[str, Any]]:
        """Start the engines wave by wave, beside the learners already starting: engines that share a GPU start
        one after another. Returns every actor's health report; the last wait covers the learners too, so one
        that fails at start is reported with the last engines at the latest."""
        waves = start_waves(plan) or [[]]
        self.engines = [None] * len(plan.engines)
        health: list[dict[str, Any]] = []
        for j, wave in enumerate(waves):
            for i in wave:
                self.engines[i] = self.factory.engine(i, self.folders.engine_paths, self.version)
            last = j == len(waves) - 1
            refs = [self.engines[i].health.remote() for i in wave] + (
                [a.health.remote() for a in self.learners] if last else [])
            what = "actor start-up" if last else f"engine start-up, wave {j + 1} of {len(waves)} (engines sharing a GPU)"
            health += self.waiter.get(refs, what, self.cfg.startup_timeout_s)
        return health

    def _note_actors(self, health: list[dict[str, Any]]) -> None:
        if self.status is None:
            return
        actors = dict(self.status.data.get("actors", {}))
        actors.update({h["name"]: h.get("pid") for h in health if "name" in h})
        nodes = dict(self.status.data.get("actor_nodes", {}))
        nodes.update({h["name"]: h.get("node") for h in health if "name" in h})
        self.status.update(actors=actors, actor_nodes=nodes, ray_session=ray_session_dir())

    def _resync_engine(self, index: int, actor: Any) -> None:
        try:
            self.transport.replace_engine(index, actor)
        except SyncError as err:
            raise EngineLost(f"{self.engine_names[index]} was re-created but could not get the weights: {err}") from err

    def _restore(self, point: ResumePoint) -> None:
        """Loop state from a checkpoint: step, version, breaker, and the rollouts generated ahead."""
        from rlgen.runtime.checkpoint import read_rollouts

        state = point.state
        self.next_step = int(state["step"])
        self.async_steps = int(state["async_steps"])
        self.breaker.load_state_dict(state.get("breaker", {}))
        self.rollouts.restore(read_rollouts(point.checkpoint)["flights"], self.next_step)

    def _learner_get(self, refs: Any, what: str, names: list[str] | None = None) -> Any:
        return self.waiter.learner_get(refs, what, names, self.folders.learner_nodes if self.folders else [])

    # -- train ------------------------------------------------------------------------------------------
    def train(self, sink) -> dict:
        """Run steps next_step .. steps-1, checkpointing every checkpoint.every steps and at the end. A stop
        request or an engine that dies too often ends it with a checkpoint (RunStopped); a dead learner ends
        it at the last checkpoint."""
        from rlgen.metrics.balance import BalanceTracker, context_from_plan

        cfg = self.cfg
        self.sink = sink
        tracker = BalanceTracker(context_from_plan(self.plan))
        for rec in sink.records:  # a resumed run: the verdict carries on from the steps already run
            tracker.update(rec)
        self._last_kind = tracker.rolling.kind if tracker.rolling else None
        try:
            for step in range(self.next_step, cfg.steps):
                if self.stop.requested:
                    raise StopRequested(f"step {step}")
                halt = self._step(step, sink, tracker)
                if halt is not None:
                    raise RunError(halt)
                every = cfg.checkpoint.every
                if every > 0 and self.next_step % every == 0 and self.next_step < cfg.steps:
                    self.checkpoint("every")
            self._finish_updates()
            self.checkpoint("final")
        except StopRequested:
            raise self._stopped(self.stop.name, self.stop.exit_code, write=True) from None
        except EngineLost as err:
            raise self._stopped(str(err), 1, write=True) from err
        except LearnerLost as err:
            raise self._stopped(f"a learner died ({err})", 1, write=False) from err
        return sink.summary()

    def _step(self, step: int, sink, tracker) -> str | None:
        """One step; returns the breaker's halt message when it halts the run."""
        from rlgen.runtime.batch import build_batch
        from rlgen.tasks.scoring import RewardError

        cfg, ro = self.cfg, self.rollouts
        t_step = time.time()
        tl = StepTimeline(step)
        ro.fill(step, self.async_steps, self.transport.version)
        flight = ro.pending[0]
        t0 = time.time()
        ro.collect(flight)
        ro.pending.popleft()
        self.startup.setdefault("first_rollout_s", time.time() - STARTED_AT)
        tl.add("learner0", Phase.wait, t0, time.time())
        self._add_engine_spans(tl, flight)

        t0 = time.time()
        try:
            ro.prepare(flight)
            scores = ro.scorer.result(flight.scoring)
        except RewardError as err:
            raise RunError(str(err)) from err
        batch = build_batch(flight.prepared, scores.totals, self.pad_id, cfg.algo.std_normalize)
        tl.add("driver", Phase.reward, t0, time.time())

        staleness = self.version - batch.version
        for r in self.transport.before_train():  # colocated engines sleep while the learner trains
            for phase, a, b in r["spans"]:
                tl.add(r["actor"], Phase(phase), a, b)
        metrics = self._train(batch, step, tl)
        metrics.update(scores.means())

        event = self.breaker.update(step, metrics, batch)
        halt = event is not None and event.action is BreakerAction.halt
        if event is not None:
            sink.console.print(f"[yellow]breaker:[/] {escape(event.message)}", highlight=False)
            if event.action is BreakerAction.tighten:
                self.async_steps = 0
        self._push(metrics, halt, tl)
        metrics.update(self.breaker.metrics())
        metrics["engine_restarts"] = self.keeper.total_restarts
        if ro.eval_set and ((step + 1) % cfg.eval.every == 0 or step + 1 == cfg.steps):
            metrics.update(ro.evaluate(step, self.transport.version))

        rec = step_record(step, tl, batch, scores.totals, metrics, self.version, staleness, time.time() - t_step,
                          len(self.learners))
        verdict = tracker.update(rec)
        rec["balance"] = verdict.to_dict()
        self.next_step = step + 1
        sink.log(rec)
        if step > 0 and verdict.kind != self._last_kind:
            sink.console.print(f"[cyan]balance:[/] {verdict.advice}", highlight=False)
        self._last_kind = verdict.kind
        return event.message if halt else None

    def _add_engine_spans(self, tl: StepTimeline, flight: InFlight) -> None:
        for i, res in flight.results.items():
            for phase, a, b in res.get("spans", []):
                tl.add(self.engine_names[i], Phase(phase), a, b)
        for i, spans in flight.update_spans.items():
            for phase, a, b in spans:
                tl.add(self.engine_names[i], Phase(phase), a, b)

    def _push(self, metrics: dict, halt: bool, tl: StepTimeline) -> None:
        """The new version to the engines, unless the step was skipped or the breaker halts the run."""
        if not metrics.get("skipped"):
            self.version = int(metrics["version"])
            if not halt:
                in_flight = self.async_steps > 0 and bool(self.rollouts.pending)
                try:
                    res = self.transport.push(self.version, in_flight=in_flight)
                except SyncError as err:
                    raise RunError(f"weight sync to version {self.version} failed: {err}") from err
                for r in res.results:
                    for phase, a, b in r.get("spans", []):
                        tl.add(r["actor"], Phase(phase), a, b)
                    for part, seconds in r.get("parts", {}).items():  # the learner's breakdown of an IPC update
                        metrics[f"sync_{part}_s"] = seconds
                self.rollouts.queued_updates = {i: (self.keeper.incarnation[i], ref) for i, ref in enumerate(res.pending)}
                return
        self.transport.no_update()  # colocated: wake the engines on their old weights

    def _finish_updates(self) -> None:
        """Surface any failure of the last weight update rather than dropping it."""
        from ray.exceptions import RayActorError

        for i, (inc, ref) in list(self.rollouts.queued_updates.items()):
            try:
                self.waiter.get(ref, "final weight update", interruptible=False)
            except RunError as err:
                if not isinstance(err.__cause__, RayActorError):
                    raise
                self.keeper.is_dead(i, inc, err.__cause__)
        self.rollouts.queued_updates = {}

    def _train(self, batch, step: int, tl: StepTimeline) -> dict:
        """One optimizer step of the learner group: each rank trains on its shard of the rows; one metrics
        dict comes back, every rank's spans go on the timeline. While it trains, the next flight's rollouts
        are prepared and scored if they are in."""
        from rlgen.learners.group import merge_rank_metrics, shard_rows

        if len(self.learners) == 1:
            shards = [batch]
        else:
            import torch

            shards = [batch.select(torch.arange(r.start, r.stop)) for r in shard_rows(batch.num_sequences, len(self.learners))]
        refs = [a.train_step.remote(b) for a, b in zip(self.learners, shards)]
        self.rollouts.prefetch()
        per_rank = self._learner_get(refs, f"training step {step}", [f"learner{r}" for r in range(len(self.learners))])
        for rank, m in enumerate(per_rank):
            for phase, a, b in m.get("spans", []):
                tl.add(f"learner{rank}", Phase(phase), a, b)
        return merge_rank_metrics(per_rank)

    # -- checkpoints and stops --------------------------------------------------------------------------
    def checkpoint(self, reason: str) -> Path:
        """Write checkpoint step_<next_step>: the learners' state, the tokenizer, the loop state and the
        rollouts generated ahead of the learner. Rollouts launched with the current weights are not kept: the
        resumed run generates them again with the same seeds, and gets the same ones."""
        from rlgen.runtime.checkpoint import CHECKPOINTS

        b = self.next_step
        path = self.out_dir / CHECKPOINTS / checkpoint_name(b)
        if is_complete(path) and self.last_checkpoint is not None and self.last_checkpoint.name == path.name:
            return path  # nothing has happened since that one was written
        t0 = time.time()
        kept: list[InFlight] = []
        for flight in self.pending:
            if flight.launch_version >= self.version:
                break  # this and every later flight can be regenerated exactly
            try:
                self.rollouts.collect(flight, interruptible=False)
            except RunError as err:  # an engine that cannot come back: regenerate these on resume
                log.info("rollouts of step %d are not kept in the checkpoint: %s", flight.step, err)
                break
            kept.append(flight)
        state = run_state(
            step=b, steps=self.cfg.steps, version=self.version, async_steps=self.async_steps,
            metrics_lines=len(self.sink.records) if self.sink else b, prompts_per_step=self.cfg.algo.prompts_per_step,
            ahead=[f.step for f in kept], restarts=self.keeper.total_restarts if self.keeper else 0,
            breaker=self.breaker.state_dict(), initial_model_path=self.initial_model_path,
            wall_s=self.wall_before + (time.time() - self.sink.t0 if self.sink else 0.0), reason=reason,
            identity=identity(self.cfg, len(self.learners)),
        )
        rollouts = {"flights": [f.to_json() for f in kept]}

        def fill(tmp: Path) -> None:
            from rlgen.packing import unpack_into

            # A learner on a node that cannot see the run directory sends its files back packed.
            here = [self.folders.writes_here.get(n, True) for n in self.folders.learner_nodes]
            refs = [a.save_checkpoint.remote(str(tmp)) if ok else a.save_checkpoint_packed.remote()
                    for a, ok in zip(self.learners, here)]
            names = [f"learner{r}" for r in range(len(self.learners))]
            for ok, out in zip(here, self._learner_get(refs, "writing a checkpoint", names)):
                if not ok:
                    unpack_into(out, str(tmp))
            self.tokenizer.save_pretrained(str(tmp / "model"))  # a complete HF folder: the learner saves weights only

        path = write_checkpoint(self.out_dir, b, fill, state, rollouts, self.cfg.checkpoint.keep)
        self.last_checkpoint = path
        seconds = time.time() - t0
        log.info("checkpoint %s written in %.2f s (%s)", path, seconds, reason)
        self.checkpoint_seconds.append(seconds)
        if self.status is not None:
            self.status.update(checkpoint=str(path), step=b)
        return path

    def _stopped(self, reason: str, exit_code: int, *, write: bool) -> RunStopped:
        """The clean end of a stopped run: a checkpoint where the learner is still whole, then RunStopped."""
        path = None
        if write and self.learners:
            try:
                path = self.checkpoint(f"stop: {reason}")
            except (RunError, OSError) as err:
                log.info("no checkpoint at the stop", exc_info=err)
                reason = f"{reason}; the checkpoint at the stop could not be written ({err})"
        path = path or newest_checkpoint(self.out_dir)
        return RunStopped(reason, exit_code=exit_code, step=self.next_step, checkpoint=str(path) if path else None)

    # -- cleanup ----------------------------------------------------------------------------------------
    def final_model(self) -> Path:
        """final_model/: the last checkpoint's policy folder, hard-linked (no second copy on disk)."""
        return final_model_from(self.last_checkpoint, self.out_dir)

    def cleanup(self) -> None:
        if self.rollouts is not None:
            self.rollouts.close()
        if self.transport is not None:
            self.transport.close()
        release([*self.engines, *self.learners], self.pgs, self._started_ray)
