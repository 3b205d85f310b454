"""Plan -> Ray actors -> the GRPO loop. Reads top to bottom: setup(), train(), checkpoint(), cleanup().

One step: engines generate the step's rollouts (policy version v), the driver scores them, the learner trains
(v -> v+1), and the new weights go to the engines. Up to ``async_steps`` generations run ahead of the learner,
so generation of step s+1 overlaps training of step s; ``async_steps=0`` is strictly on-policy.

A run is a resumable value: a checkpoint (``rlgen.runtime.checkpoint``) holds the policy, the learner's
optimizer state, the step, the data cursor, the RNG states and the rollouts generated ahead, and
``resume=`` continues from it as if the run had never stopped. An engine that dies is re-created
(``rlgen.runtime.faults``); a stop signal ends the run at the next safe point with a checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rlgen.config import BreakerAction, RunConfig
from rlgen.monitor import CircuitBreaker
from rlgen.plan import Plan
from rlgen.runtime.actors import (
    QUIET_ENV,
    ActorFactory,
    engine_class,
    learner_class,
    ray_address,
    ray_session_dir,
    reserve,
    start_ray,
)
from rlgen.runtime.checkpoint import checkpoint_name, is_complete, newest_checkpoint, write_checkpoint
from rlgen.runtime.errors import RunError, RunStopped, StopRequested, actor_death_detail
from rlgen.runtime.faults import EngineKeeper, EngineLost
from rlgen.runtime.flights import InFlight, results_from_json
from rlgen.runtime.resume import ResumePoint, identity
from rlgen.runtime.stop import StopFlag
from rlgen.sync import SyncError, make_transport
from rlgen.types import Phase, StepTimeline

log = logging.getLogger(__name__)
POLL_S = 0.25  # waits wake this often to notice a stop request


def _short(err: BaseException | None, limit: int = 300) -> str:
    """An exception in one line: its type and the first line of its message."""
    if err is None:
        return "an error"
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}"[:limit] if first else type(err).__name__


def _culprit(refs: list[Any], names: list[str] | None) -> str | None:
    """The name of the first actor whose call failed (refs and names in the same order)."""
    import ray

    if not names:
        return None
    for ref, name in zip(refs, names):
        try:
            ray.get(ref, timeout=0)
        except Exception:  # noqa: BLE001 - this is the failed one
            return name
    return None


class LearnerLost(RunError):
    """A learner actor died: its state is gone, so the run stops and resumes from the last checkpoint."""


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
        self.cfg, self.plan, self.out_dir = cfg, plan, Path(out_dir)
        self._engine_cls, self._engine_kwargs, self._learner_cls = engine_cls, dict(engine_kwargs or {}), learner_cls
        self.resume, self.stop, self.status = resume, stop or StopFlag(), status
        self.console = console or Console()
        self.breaker = CircuitBreaker(cfg.monitor, self.out_dir)
        self.engines: list[Any] = []
        self.engine_names: list[str] = []
        self.learner: Any = None  # rank 0: speaks for the learner group (weights, saving)
        self.learners: list[Any] = []  # every rank, rank 0 first
        self.pgs: list[Any] = []
        self._started_ray = False
        self.async_steps = cfg.algo.async_steps
        self.transport: Any = None
        self.keeper: EngineKeeper | None = None
        self.pending: deque[InFlight] = deque()
        self.queued_updates: dict[int, tuple[int, Any]] = {}  # object store: applied before each engine's next generate
        self.next_step = 0  # steps finished
        self.next_gen = 0  # the next step to launch generation for
        self.version = 0  # the learner's policy version; engines start with the same weights
        self.last_checkpoint: Path | None = resume.checkpoint if resume else None
        self.wall_before = float(resume.state.get("wall_s", 0.0)) if resume else 0.0

    # -- setup ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        from rlgen.models import load_tokenizer, prepare_model
        from rlgen.tasks import build_task

        cfg, plan = self.cfg, self.plan
        for var, val in QUIET_ENV.items():  # before transformers loads in this process (actors get them too)
            os.environ.setdefault(var, val)
        self.task = build_task(cfg.task)
        device = "cuda" if plan.device == "cuda" else "cpu"
        self.initial_model_path = prepare_model(cfg, device=device)
        # Actors start from the checkpoint's policy when resuming; the frozen reference stays the initial model.
        self.start_model_path = str(self.resume.checkpoint / "model") if self.resume else self.initial_model_path
        self.version = self.start_version = int(self.resume.state["version"]) if self.resume else 0
        self.tokenizer = load_tokenizer(self.start_model_path)
        self.eos_ids = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

        self._connect()
        self._place_folders()

        engine_cls, engine_kwargs = (self._engine_cls, dict(self._engine_kwargs)) if self._engine_cls else engine_class(plan)
        learner_cls, learner_kwargs = (self._learner_cls, {}) if self._learner_cls else learner_class(cfg, plan)
        self.factory = ActorFactory(cfg, plan, self.placement, self.pgs, self.node_ids, engine_cls, engine_kwargs,
                                    learner_cls, learner_kwargs)
        self.engines = [self.factory.engine(i, self.engine_paths, self.version) for i in range(len(plan.engines))]
        self.engine_names = [f"engine{s.index}" for s in plan.engines]
        rendezvous = None
        if len(self.placement.learners) > 1:
            rendezvous = self._get(self.factory.rendezvous_ref(), "finding the learner group's rendezvous",
                                   cfg.startup_timeout_s)
        self.learners = self.factory.learners(self.learner_paths, rendezvous, **self.learner_extra)
        self.learner = self.learners[0]
        health = self._get([a.health.remote() for a in [*self.engines, *self.learners]], "actor start-up",
                           cfg.startup_timeout_s)
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
        except SyncError as err:
            raise RunError(f"weight sync set-up failed: {err}") from err
        self.keeper = EngineKeeper(
            self.engines, self.engine_names, cfg.engine.max_restarts,
            create=lambda i: self.factory.engine(i, self.engine_paths, self.start_version),
            ready=lambda actor, what: self._note_actors(self._get([actor.health.remote()], what, cfg.startup_timeout_s)),
            resync=self._resync_engine,
            say=lambda msg: self.console.print(f"[yellow]engine restart:[/] {escape(msg)}", highlight=False),
            node_of=self.factory.engine_node,
        )
        if self.resume:
            self._restore(self.resume)

    def _connect(self) -> None:
        """Join or start the cluster, give each plan node its own Ray node, and reserve the bundles there."""
        from rlgen.plan.placement import plan_bundles
        from rlgen.runtime.cluster import assign_nodes, cluster_nodes

        cfg = self.cfg
        self.placement = plan_bundles(self.plan)
        self._started_ray = start_ray(cfg, self.plan, self.placement)
        self.stop.rearm()  # ray.init takes SIGTERM for itself; take it back
        self.node_ids = assign_nodes(self.placement, cluster_nodes(), ray_address(cfg) or "this machine")
        self.pgs = reserve(self.placement, self.node_ids, cfg.startup_timeout_s,
                           lambda refs, what, t: self._get(refs, what, t))

    def _place_folders(self) -> None:
        """Where each node's actors read the model (and, resuming, the checkpoint), and whether the learners
        can write checkpoints into the run directory; ray.share decides what is shipped (runtime.files)."""
        from rlgen.runtime.files import place_folder, sees_run_dir

        cfg, t = self.cfg, self.cfg.startup_timeout_s
        engine_nodes = [self.node_ids[ap.group] for ap in self.placement.engines]
        learner_nodes = [self.node_ids[ap.group] for ap in self.placement.learners]
        self.engine_paths = place_folder(self.start_model_path, engine_nodes, cfg.ray.share, t)
        self.learner_extra: dict[str, Any] = {}
        if self.resume:
            ckpt = place_folder(str(self.resume.checkpoint), learner_nodes, cfg.ray.share, t)
            self.learner_paths = {n: str(Path(p) / "model") for n, p in ckpt.items()}
            self.learner_extra["resume_from"] = ckpt
            if cfg.algo.kl_coef > 0:
                self.learner_extra["ref_model_path"] = place_folder(self.initial_model_path, learner_nodes,
                                                                    cfg.ray.share, t)
        else:
            self.learner_paths = place_folder(self.start_model_path, learner_nodes, cfg.ray.share, t)
        self.writes_here = sees_run_dir(str(self.out_dir), learner_nodes, cfg.ray.share, t)
        self.learner_nodes = learner_nodes

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
        saved = read_rollouts(point.checkpoint)["flights"]
        for data in saved:
            flight = self._new_flight(int(data["step"]), int(data["launch_version"]))
            flight.results = results_from_json(data)
            self.pending.append(flight)
        self.next_gen = self.pending[-1].step + 1 if self.pending else self.next_step

    # -- waits ------------------------------------------------------------------------------------------
    def _get(self, refs: Any, what: str, timeout_s: float | None = None, *, interruptible: bool = True,
             names: list[str] | None = None) -> Any:
        """ray.get with a timeout, woken every POLL_S to notice a stop request (interruptible waits then raise
        StopRequested). Errors become RunError with what failed (names: the actor behind each ref)."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        timeout_s = self.cfg.timeout_s if timeout_s is None else timeout_s
        key = "timeout_s" if timeout_s == self.cfg.timeout_s else "startup_timeout_s"
        many = isinstance(refs, list)
        todo = list(refs) if many else [refs]
        deadline = time.time() + timeout_s
        while todo:
            if interruptible and self.stop.requested:
                raise StopRequested(what)
            left = deadline - time.time()
            if left <= 0:
                raise RunError(
                    f"{what} did not finish within {key}={timeout_s:.0f} s; an actor may be stuck or the step too "
                    f"large. Raise {key}=<seconds> or shrink algo.prompts_per_step."
                )
            _, todo = ray.wait(todo, num_returns=len(todo), timeout=min(POLL_S, left))
        try:
            values = ray.get(list(refs) if many else refs)
        except RayActorError as err:
            raise RunError(
                f"{what} failed because an actor died ({actor_death_detail(err)}). Metrics up to the last finished "
                f"step are in {self.out_dir}."
            ) from err
        except RayTaskError as err:
            log.info("%s raised in an actor", what, exc_info=err)
            who = _culprit(list(refs) if many else [refs], names) or "an actor"
            raise RunError(f"{what}: {who} raised {_short(err.cause)}") from err
        return values

    def _learner_get(self, refs: Any, what: str, names: list[str] | None = None) -> Any:
        """A learner call: never interrupted (the learner's state must stay whole); a dead learner ends the run."""
        from ray.exceptions import RayActorError

        try:
            return self._get(refs, what, interruptible=False, names=names)
        except RunError as err:
            if isinstance(err.__cause__, RayActorError):
                from rlgen.runtime.cluster import node_alive

                gone = [f"learner{r}" for r, n in enumerate(getattr(self, "learner_nodes", [])) if not node_alive(n)]
                why = f"the node of {', '.join(gone)} left the Ray cluster" if gone else \
                    actor_death_detail(err.__cause__, limit=300)
                raise LearnerLost(f"{what}: {why}") from err
            raise

    # -- generation -------------------------------------------------------------------------------------
    def _new_flight(self, step: int, launch_version: int) -> InFlight:
        from rlgen.rollout import encode_prompts, sampling_params, split_requests

        sp = encode_prompts(step, self.task, self.tokenizer, self.cfg)
        sampling = sampling_params(self.cfg, self.eos_ids, seed=self.cfg.seed * 100_003 + step)
        return InFlight(step, sp, split_requests(sp, sampling, len(self.engines)), launch_version)

    def _launch(self, step: int) -> InFlight:
        flight = self._new_flight(step, self.transport.version)
        for i, reqs in enumerate(flight.shards):
            if reqs:
                flight.refs[i] = (self.keeper.incarnation[i], self.engines[i].generate.remote(reqs))
        flight.updates, self.queued_updates = self.queued_updates, {}
        return flight

    def _collect(self, flight: InFlight, *, interruptible: bool = True) -> None:
        """Wait for a flight's results. An engine that died is re-created and its requests are sent again (with
        the same seeds: async_steps=0 gets the very same rollouts); a stop request raises StopRequested."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        what = f"generation for step {flight.step}"
        deadline = time.time() + self.cfg.timeout_s
        while flight.refs:
            if interruptible and self.stop.requested:
                raise StopRequested(what)
            left = deadline - time.time()
            if left <= 0:
                raise RunError(
                    f"{what} did not finish within timeout_s={self.cfg.timeout_s:.0f} s; an actor may be stuck or "
                    "the step too large. Raise timeout_s=<seconds> or shrink algo.prompts_per_step."
                )
            ready, _ = ray.wait([ref for _, ref in flight.refs.values()], num_returns=1, timeout=min(POLL_S, left))
            for i, (inc, ref) in list(flight.refs.items()):
                if ref not in ready:
                    continue
                try:
                    flight.results[i] = ray.get(ref)
                    del flight.refs[i]
                except RayActorError as err:
                    self.keeper.is_dead(i, inc, err)
                    flight.refs[i] = (self.keeper.incarnation[i], self.engines[i].generate.remote(flight.shards[i]))
                    deadline = time.time() + self.cfg.timeout_s
                except RayTaskError as err:
                    log.info("%s raised in %s", what, self.engine_names[i], exc_info=err)
                    raise RunError(f"{what}: {self.engine_names[i]} raised {_short(err.cause)}") from err
        for i, (inc, ref) in list(flight.updates.items()):  # weights queued before this generate (object store)
            try:
                res = ray.get(ref, timeout=self.cfg.timeout_s)
                flight.results.setdefault(i, {}).setdefault("update_spans", []).extend(res.get("spans", []))
            except RayActorError as err:
                self.keeper.is_dead(i, inc, err)  # the re-created engine got the current weights already
            del flight.updates[i]

    def _fill(self, step: int) -> None:
        while self.next_gen < self.cfg.steps and self.next_gen <= step + self.async_steps:
            self.pending.append(self._launch(self.next_gen))
            self.next_gen += 1

    # -- train ------------------------------------------------------------------------------------------
    def train(self, sink) -> dict:
        """Run steps next_step .. steps-1, checkpointing every checkpoint.every steps and at the end. A stop
        request or an engine that dies too often ends it with a checkpoint (RunStopped); a dead learner ends
        it at the last checkpoint."""
        from rlgen.balancer import BalanceTracker, context_from_plan

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
        from rlgen.rollout import RewardError, RolloutCountError, build_batch, check_complete, score

        cfg = self.cfg
        t_step = time.time()
        tl = StepTimeline(step)
        self._fill(step)
        flight = self.pending[0]
        t0 = time.time()
        self._collect(flight)
        self.pending.popleft()
        tl.add("learner0", Phase.wait, t0, time.time())
        for i, res in flight.results.items():
            for phase, a, b in [*res.get("spans", []), *res.get("update_spans", [])]:
                tl.add(self.engine_names[i], Phase(phase), a, b)

        t0 = time.time()
        completions = flight.completions()
        try:
            check_complete(completions, flight.prompts, cfg.algo.samples_per_prompt)
        except RolloutCountError as err:
            raise RunError(str(err)) from err
        try:
            rewards = score(completions, flight.prompts, self.task, self.tokenizer, cfg.task.reward)
        except RewardError as err:
            raise RunError(str(err)) from err
        batch = build_batch(completions, rewards, self.pad_id, cfg.algo.std_normalize)
        tl.add("driver", Phase.reward, t0, time.time())

        staleness = self.version - batch.version
        for r in self.transport.before_train():  # colocated engines sleep while the learner trains
            for phase, a, b in r["spans"]:
                tl.add(r["actor"], Phase(phase), a, b)
        metrics = self._train(batch, step, tl)

        event = self.breaker.update(step, metrics, batch)
        halt = event is not None and event.action is BreakerAction.halt
        if event is not None:
            sink.console.print(f"[yellow]breaker:[/] {escape(event.message)}", highlight=False)
            if event.action is BreakerAction.tighten:
                self.async_steps = 0
        pushed = False
        if not metrics.get("skipped"):
            self.version = int(metrics["version"])
            if not halt:
                try:
                    res = self.transport.push(self.version, in_flight=self.async_steps > 0 and bool(self.pending))
                except SyncError as err:
                    raise RunError(f"weight sync to version {self.version} failed: {err}") from err
                for r in res.results:
                    for phase, a, b in r.get("spans", []):
                        tl.add(r["actor"], Phase(phase), a, b)
                self.queued_updates = {i: (self.keeper.incarnation[i], ref) for i, ref in enumerate(res.pending)}
                pushed = True
        if not pushed:
            self.transport.no_update()  # colocated: wake the engines on their old weights
        metrics.update(self.breaker.metrics())
        metrics["engine_restarts"] = self.keeper.total_restarts

        rec = self._record(step, tl, batch, rewards, metrics, staleness, time.time() - t_step)
        verdict = tracker.update(rec)
        rec["balance"] = verdict.to_dict()
        self.next_step = step + 1
        sink.log(rec)
        if step > 0 and verdict.kind != self._last_kind:
            sink.console.print(f"[cyan]balance:[/] {verdict.advice}", highlight=False)
        self._last_kind = verdict.kind
        return event.message if halt else None

    def _finish_updates(self) -> None:
        """Surface any failure of the last weight update rather than dropping it."""
        from ray.exceptions import RayActorError

        for i, (inc, ref) in list(self.queued_updates.items()):
            try:
                self._get(ref, "final weight update", interruptible=False)
            except RunError as err:
                if not isinstance(err.__cause__, RayActorError):
                    raise
                self.keeper.is_dead(i, inc, err.__cause__)
        self.queued_updates = {}

    def _train(self, batch, step: int, tl: StepTimeline) -> dict:
        """One optimizer step of the learner group: each rank trains on its shard of the rows; one metrics
        dict comes back, every rank's spans go on the timeline."""
        from rlgen.learners.group import merge_rank_metrics, shard_rows

        if len(self.learners) == 1:
            shards = [batch]
        else:
            import torch

            shards = [batch.select(torch.arange(r.start, r.stop)) for r in shard_rows(batch.num_sequences, len(self.learners))]
        per_rank = self._learner_get([a.train_step.remote(b) for a, b in zip(self.learners, shards)],
                                     f"training step {step}", [f"learner{r}" for r in range(len(self.learners))])
        for rank, m in enumerate(per_rank):
            for phase, a, b in m.get("spans", []):
                tl.add(f"learner{rank}", Phase(phase), a, b)
        return merge_rank_metrics(per_rank)

    def _record(self, step, tl: StepTimeline, batch, rewards, metrics, staleness, step_s) -> dict:
        gen_spans = [s for s in tl.spans if s.phase == Phase.generate]
        gen_wall = (max(s.end for s in gen_spans) - min(s.start for s in gen_spans)) if gen_spans else 0.0
        tokens = batch.num_response_tokens
        n = len(rewards)
        mean = sum(rewards) / n
        std = (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5
        sync_engine = max((s.seconds for s in tl.spans if s.phase == Phase.sync and not s.actor.startswith("learner")),
                          default=0.0)
        train_s = max((tl.total(Phase.train, f"learner{r}") for r in range(len(self.learners) or 1)), default=0.0)
        rec = {
            "step": step,
            "version": self.version,
            "batch_version": batch.version,
            "staleness": staleness,
            "reward_mean": mean,
            "reward_std": std,
            "response_tokens": tokens,
            "sequences": n,
            "tokens_per_s": tokens / gen_wall if gen_wall > 0 else 0.0,
            "generate_s": gen_wall,
            "reward_s": tl.total(Phase.reward),
            "wait_s": tl.total(Phase.wait, "learner0"),
            "train_s": train_s,
            "sync_s": tl.total(Phase.sync, "learner0") + sync_engine,
            "step_s": step_s,
            # max(gen, train) / step: 1.0 when the shorter side hides entirely behind the longer one
            "overlap_efficiency": max(gen_wall, train_s) / step_s if step_s > 0 else 0.0,
        }
        rec.update({k: v for k, v in metrics.items() if isinstance(v, (int, float, bool, str))})
        rec["version"] = self.version
        rec["timeline"] = tl.to_dict()["spans"]
        return rec

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
                self._collect(flight, interruptible=False)
            except RunError as err:  # an engine that cannot come back: regenerate these on resume
                log.info("rollouts of step %d are not kept in the checkpoint: %s", flight.step, err)
                break
            kept.append(flight)
        state = {
            "step": b,
            "steps": self.cfg.steps,
            "version": self.version,
            "async_steps": self.async_steps,
            "metrics_lines": len(self.sink.records) if getattr(self, "sink", None) else b,
            "data_cursor": {
                "next_step": b,
                "prompts_per_step": self.cfg.algo.prompts_per_step,
                "prompts_consumed": b * self.cfg.algo.prompts_per_step,
                "generated_ahead": [f.step for f in kept],
            },
            "engines": "sampling is seeded per step (seed * 100003 + step); engines keep no RNG state",
            "engine_restarts": self.keeper.total_restarts if self.keeper else 0,
            "breaker": self.breaker.state_dict(),
            "initial_model_path": self.initial_model_path,
            "wall_s": self.wall_before + (time.time() - self.sink.t0 if getattr(self, "sink", None) else 0.0),
            "reason": reason,
            "created": time.time(),
            **identity(self.cfg, len(self.learners)),
        }
        rollouts = {"flights": [f.to_json() for f in kept]}

        def fill(tmp: Path) -> None:
            from rlgen.runtime.files import unpack_into

            # A learner on a node that cannot see the run directory sends its files back packed.
            here = [self.writes_here.get(n, True) for n in self.learner_nodes]
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
        self.checkpoint_seconds = getattr(self, "checkpoint_seconds", []) + [seconds]
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
        from rlgen.runtime.checkpoint import link_tree

        path = self.out_dir / "final_model"
        if path.exists():
            import shutil

            shutil.rmtree(path)
        link_tree(self.last_checkpoint / "model", path)
        return path

    def cleanup(self) -> None:
        import ray

        if self.transport is not None:
            self.transport.close()
        if not ray.is_initialized():
            return
        for a in [*self.engines, *self.learners]:
            if a is not None:
                try:
                    ray.kill(a)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001
                pass
        if self._started_ray:
            ray.shutdown()
