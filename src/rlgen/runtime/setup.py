"""Set-up and tear-down: a plan becomes a Run, the actors and the objects that drive them.

In order: the algorithm, the model and the task load on threads of their own while a Ray cluster starts; the
learner ranks and the engines start all at once (engines whose model folder is still being built are asked for as
soon as the cluster is up, and wait for it); the weight transport sends the starting weights (or, where
the engines hold them already, the learners finish beside the first batch); then come the engine keeper, the
rollouts and the run state. With engine.keep_warm_s a cluster and its engines outlive a run that ends well,
and the next run with the same settings takes them over. docs/startup.md walks through each phase.

Everything comes from the plan; nothing here decides what the plan already decided."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from rlgen.config import ShareMode
from rlgen.learners.registry import LEARNERS
from rlgen.models import architectures
from rlgen.plan import Plan
from rlgen.plan.placement import plan_bundles
from rlgen.runtime.cluster import kept_engines
from rlgen.runtime.cluster.actors import (
    QUIET_ENV,
    ActorFactory,
    actor_env,
    connect,
    engine_class,
    learner_class,
    release,
    warm_cluster,
)
from rlgen.runtime.cluster.local_ray import keep_local
from rlgen.runtime.cluster.waits import Waiter, short
from rlgen.runtime.durability.checkpoint import finish_background, restore_rollouts
from rlgen.runtime.durability.resume import ResumePoint
from rlgen.runtime.durability.shared_folders import place_folder, place_run_folders
from rlgen.runtime.errors import RunError, StopRequested
from rlgen.runtime.rollouts.engine_restarts import EngineKeeper, EngineLost
from rlgen.runtime.rollouts.generation import Rollouts
from rlgen.runtime.run_handle import Built, Run, Services
from rlgen.runtime.signals import StopFlag
from rlgen.runtime.start.early_engines import EarlyEngines, engines_before_folder
from rlgen.runtime.start.loaders import start_loaders
from rlgen.runtime.start.on_thread import Beside
from rlgen.runtime.start.progress import StartupClock
from rlgen.runtime.start.transport import make_transport
from rlgen.runtime.state.breaker import CircuitBreaker
from rlgen.runtime.state.run_state import RunState
from rlgen.sync.waits import SyncError
from rlgen.tasks.scoring import Scorer

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from rlgen.runtime.durability.status_file import RunStatus
    from rlgen.sync.transports.base import TransportBase
    from rlgen.tasks.base import Task
    from rlgen.tasks.prompts import PromptRenderer
    from rlgen.types import JSONDict

log = logging.getLogger(__name__)
ACTORS = "engines and learners"
LEARNERS_BESIDE = "learners and weight transport (beside the first batch)"
KEPT_ENGINE_WAKES = "an engine an earlier run kept warm wakes and takes this run's starting weights"


@dataclass
class Hooks:
    """Classes that replace the plan's engine or learner actor (tests inject faults and stand-ins with them)."""

    engine_cls: type | None = None
    engine_kwargs: dict[str, object] = field(default_factory=dict)  # passed on to engine_cls
    learner_cls: type | None = None


def set_up(plan: Plan, out_dir: Path, *, resume: ResumePoint | None = None, stop: StopFlag | None = None,
           console: Console | None = None, status: RunStatus | None = None, hooks: Hooks | None = None) -> Run:
    """The plan's actors, started and given the starting weights. On failure what was started is taken down
    (tear_down) before the error goes on."""
    cfg = plan.config
    stop = stop or StopFlag()
    breaker = CircuitBreaker(cfg.monitor, Path(out_dir))
    state = RunState.resumed(resume, breaker) if resume else RunState.start(plan.async_steps, breaker)
    services = Services(console or Console(), stop, Waiter(cfg.timeout_s, stop, Path(out_dir)), status=status)
    run = Run(plan, Path(out_dir), Built(resume=resume), state, services)
    t0 = time.time()
    run.services.clock = clock = StartupClock(run.services.console)
    hooks = hooks or Hooks()
    early: EarlyEngines | None = None
    try:
        for var, val in QUIET_ENV.items():  # before transformers loads in this process (actors get them too)
            os.environ.setdefault(var, val)
        _engines_ahead(run)
        algo, model, task_loader = start_loaders(run)
        with clock.phase("Ray cluster"):
            _cluster(run)
        early = engines_before_folder(run, lambda: _factory(run, hooks), model, ACTORS)  # where the model folder is still being built
        model.result(run.services.stop)
        _place_folders(run)
        loop_inputs: list[tuple[Task, PromptRenderer, list[int]]] = []  # once the actors are asked for
        end = early.end_phase if early is not None else clock.begin(ACTORS)
        try:
            _actors(run, hooks, algo, before_wait=lambda: loop_inputs.append(
                task_loader.result(run.services.stop, "preparing the tokenizer and task")), early=early)
        finally:
            end()
        early = None  # the run's engines now
        task, renderer, stop_ids = loop_inputs[0]
        if run.built.learners_to_wait is None:
            with clock.phase("first weight push"):
                _start_transport(run)
        else:
            run.built.learners_pending = Beside(_learners_beside, run, *run.built.learners_to_wait,
                                                done=clock.begin(LEARNERS_BESIDE, beside=True))
            run.built.learners_to_wait = None
        _loop_parts(run, task, renderer, stop_ids)
    except BaseException as err:
        if early is not None:
            early.stop()
        tear_down(run)
        if take_over_failed(run, err):
            raise TakeOverFailed(err) from err
        raise
    run.services.startup["setup_s"] = time.time() - t0
    if run.built.learners_pending is None:
        run.built.freeze()  # set-up is done (else once the learners are ready: Built.learners_ready)
    return run


class TakeOverFailed(Exception):
    """Set-up on a cluster taken over from a run that kept it warm failed; what was taken over is stopped, and a
    cold start may well succeed. ``err`` is what failed."""

    def __init__(self, err: BaseException):
        super().__init__(str(err))
        self.err = err


def take_over_failed(run: Run | None, err: BaseException) -> bool:
    """Whether err ended a run that took a kept cluster over before its first step was done (not a stop someone
    asked for): the cluster may not start this run's workers as a new one would, so the run starts cold instead."""
    if isinstance(err, TakeOverFailed):
        return True
    if run is None or not run.built.taken_over or not isinstance(err, Exception) or isinstance(err, StopRequested):
        return False
    built = run.built
    first = built.resume.step if built.resume else 0
    return not run.services.stop.requested and run.state.step == first


def say_cold_start(err: BaseException) -> None:
    """The one line for a run that falls back from a kept cluster it took over to a cold start."""
    cause = err.err if isinstance(err, TakeOverFailed) else err
    first = next((ln.strip() for ln in str(cause).splitlines() if ln.strip()), type(cause).__name__)
    first = first.split(" Metrics up to the last finished step")[0].rstrip(".")  # none: the run starts again
    log.warning("the run could not start on the kept Ray cluster it took over (%s); that cluster was stopped and "
                "the run starts again on a new one", first if len(first) <= 400 else first[:400] + "...")


def _engines_ahead(run: Run) -> None:
    """What the engine kind can begin on this host before its engines are asked for (engines on GPUs only)."""

    spec = run.plan.engine
    if spec.ahead is not None and run.plan.device == "cuda":
        spec.ahead(architectures(run.cfg.model), actor_env(run.cfg, dict(run.plan.engine_env)))


def _cluster(run: Run) -> None:
    built = run.built
    built.placement = plan_bundles(run.plan)
    keep = run.plan.engine.keeps_warm and run.cfg.engine.keep_warm_s > 0
    try:
        built.started_ray, built.node_ids, built.pgs = connect(run.cfg, run.plan, built.placement, run.services.stop,
                                                               run.services.waiter, keep)
    finally:
        cluster = warm_cluster()
        built.taken_over = bool(cluster is not None and cluster.taken_over)
        built.started_ray = built.started_ray or cluster is not None  # one joined before connect failed goes whole


def _place_folders(run: Run) -> None:
    """Where every node reads the starting model (and the checkpoint, when resuming): needs the cluster's nodes
    and the model folder."""
    built = run.built
    built.folders = place_run_folders(run.cfg, built.node_ids, built.placement, built.start_model_path, run.out_dir,
                                      built.initial_model_path, built.resume.checkpoint if built.resume else None,
                                      built.teacher_path or None)


def _factory(run: Run, hooks: Hooks) -> ActorFactory:
    """The run's actor factory, its engine side (the learner side is filled in once the engines are asked for:
    the learner's class imports torch)."""
    built = run.built
    engine_cls, engine_kwargs = (hooks.engine_cls, dict(hooks.engine_kwargs)) if hooks.engine_cls else engine_class(run.plan)
    built.engine_names = [f"engine{s.index}" for s in run.plan.engines]
    return ActorFactory(run.cfg, run.plan, built.placement, built.pgs, built.node_ids, engine_cls, engine_kwargs,
                        type(None), {}, warm=warm_cluster() is not None)


def _actors(run: Run, hooks: Hooks, algo: Beside, before_wait: Callable[[], None] = lambda: None,
            early: EarlyEngines | None = None) -> None:
    """The engines, then the learner ranks; every actor healthy. The engines are asked for first: theirs is the
    longest start, and the learners take the algorithm, which may still be importing (``algo``). before_wait
    runs once all are asked for. early: the engines asked for before the model folder was there."""
    services = run.services
    built = run.built
    cfg, plan = run.cfg, run.plan
    if early is None:
        built.factory = _factory(run, hooks)
    assert built.factory is not None
    asked: dict[str, float] = {}
    engines, taken = _ask_engines(run, asked, early)
    learner_cls, learner_kwargs = learner_class(plan)
    built.factory.learner_cls = hooks.learner_cls or learner_cls  # a test's class takes the kind's arguments
    built.factory.learner_kwargs = dict(learner_kwargs)
    rendezvous = None
    if len(built.placement.learners) > 1:
        rendezvous = services.waiter.get(built.factory.rendezvous_ref(), "finding the learner group's rendezvous",
                                         cfg.startup_timeout_s)
    algo.result(services.stop, "importing the algorithm")  # its loader sets built.algorithm
    built.factory.learner_kwargs["algorithm"] = built.algorithm
    asked.update({f"learner{r}": time.time() for r in range(len(built.placement.learners))})
    built.learners = built.factory.learners(built.folders.learner_paths, rendezvous, **built.folders.learner_extra)
    health = _wait_started(run, engines, taken, asked, before_wait)
    bad = [h for h in health if not h.get("ok")]
    if bad:
        raise RunError(f"actors reported unhealthy at start-up: {bad}")
    services.note_actors(health)
    built.keeper = EngineKeeper(
        engines, built.engine_names, cfg.engine.max_restarts,
        create=lambda i: built.factory.engine(i, built.folders.engine_paths, built.start_version),
        ready=lambda actor, what: services.note_actors(
            services.waiter.get([actor.health.remote()], what, cfg.startup_timeout_s)),
        resync=lambda i, actor, resend: _resync_engine(run, i, actor, resend),
        say=lambda msg: services.console.print(f"[yellow]engine restart:[/] {escape(msg)}", highlight=False),
        node_of=built.factory.engine_node,
        place_again=lambda i, gone: _place_engine_again(run, i, gone),
    )
    built.zero3_gatherers = built.learners[1:] if learner_kwargs.get("zero_stage") == 3 else []


def _ask_engines(run: Run, asked: dict[str, float],
                 early: EarlyEngines | None = None) -> tuple[list[ActorHandle], dict[int, ObjectRef[JSONDict]]]:
    """Every engine asked for at once (vLLM engines that share a GPU take turns only to measure their KV cache:
    rlgen.engines.vllm.kvcache); kept engines taken over where the cluster kept them, and asked to wake at once
    (their take_over calls, by index); early: the engines asked for before the model folder was there, which
    are the run's where they were given the path they would be given now."""
    built = run.built
    built.start_version = run.state.version
    built.transport = _new_transport(run)
    if early is not None:
        engines = early.hand_over(run, asked)
        if engines is not None:
            return engines, {}
    kept = _kept_engines(run, asked)
    # KeepsWarm: only kinds that claim it are kept (_cluster), so only they are taken over; they wake while the
    # learners are asked for and the task loads
    taken = {i: kept[i].take_over.remote(run.state.version) for i in built.factory.kept}
    engines = [e if e is not None else _new_engine(run, i, asked) for i, e in enumerate(kept)]
    return engines, taken


def _new_engine(run: Run, index: int, asked: dict[str, float]) -> ActorHandle:
    built = run.built
    asked[built.engine_names[index]] = time.time()
    return built.factory.engine(index, built.folders.engine_paths, run.state.version)


def _wait_started(run: Run, engines: list[ActorHandle], taken: dict[int, ObjectRef[JSONDict]],
                  asked: dict[str, float], before_wait: Callable[[], None] = lambda: None) -> list[JSONDict]:
    """The health reports of the engines and learners asked for, waited for: the engines' (a kept engine's
    answer to take_over, in ``taken``), and the learners' unless they may start beside the first batch
    (run.built.learners_to_wait then holds what set_up needs for that)."""
    built = run.built
    before_wait()
    engine_refs = [taken[i] if i in taken else e.health.remote() for i, e in enumerate(engines)]
    engine_words = [KEPT_ENGINE_WAKES if i in taken else run.plan.engine.start_words for i in range(len(engines))]
    learner_refs = [a.health.remote() for a in built.learners]
    learner_names = [f"learner{r}" for r in range(len(built.learners))]
    learner_words = [_learner_words(run)] * len(learner_refs)
    first = built.transport.generates_before_start and not run.cfg.learner.lora.enabled
    health = _wait_actors(run, engine_refs + ([] if first else learner_refs),
                          built.engine_names + ([] if first else learner_names), asked,
                          doing=engine_words + ([] if first else learner_words))
    # kept engines that could not take their starting weights back get them from the transport's start
    built.transport.held_weights = any(not health[i].get("start_weights") for i in built.factory.kept)
    if not first:
        return health
    if built.transport.held_weights:
        return health + _wait_actors(run, learner_refs, learner_names, asked, doing=learner_words)
    built.learners_to_wait = (learner_refs, learner_names, asked)  # they start beside the first batch
    return health


def _learner_words(run: Run) -> str:
    """What a learner rank of the plan's learner kind does while it starts, in words."""
    return LEARNERS[run.plan.learner_kind].starting


def _wait_actors(run: Run, refs: list[ObjectRef[JSONDict]], names: list[str], asked: dict[str, float],
                 what: str = "actor start-up", doing: list[str] | None = None) -> list[JSONDict]:
    """The actors' health reports at start-up, each actor's start timed; doing: what each does while it starts,
    said while the run waits for it."""
    services = run.services
    health = services.waiter.get(refs, what, run.cfg.startup_timeout_s, names=names,
                                 progress=services.clock.waiting(names, doing) if services.clock else None)
    if services.clock:
        for h in health:
            services.clock.actor(h, asked.get(h.get("name"), services.clock.launched))
    return health


def _learners_beside(run: Run, refs: list[ObjectRef[JSONDict]], names: list[str], asked: dict[str, float]) -> None:
    """The learners' start and the weight transport's set-up, while the first batch generates (the engines hold
    the starting weights, so the transport need not send them)."""
    health = _wait_actors(run, refs, names, asked, "learner start-up", [_learner_words(run)] * len(names))
    bad = [h for h in health if not h.get("ok")]
    if bad:
        raise RunError(f"learners reported unhealthy at start-up: {bad}")
    run.services.note_actors(health)
    _start_transport(run, send=False)


def _kept_engines(run: Run, asked: dict[str, float]) -> list[ActorHandle | None]:
    """In a cluster taken over from a run that kept its engines warm (runtime.cluster.kept_engines): the kept engines this run
    would build the same way, by index (None for the others); kept engines of other settings are stopped first,
    so their memory is free for this run's. A kept engine that does not answer is stopped and started anew."""
    built = run.built
    engines: list[ActorHandle | None] = [None] * len(run.plan.engines)
    cluster = warm_cluster()
    if cluster is None or not cluster.taken_over:
        return engines
    wanted = built.factory.warm_names(built.folders.engine_paths)
    dropped = kept_engines.drop_engines(set(wanted))
    if dropped:
        log.info("stopped %d kept engine(s) of other settings: %s", len(dropped), ", ".join(dropped))
    for i, name in enumerate(wanted):
        asked[built.engine_names[i]] = time.time()
        engines[i] = kept_engines.answering(kept_engines.find_engine(name))
        if engines[i] is not None:
            built.factory.kept.add(i)
    return engines


def _place_engine_again(run: Run, index: int, gone: str) -> str | None:
    """Engine ``index``'s node left: its bundle on another node with room, and the model folder placed there."""
    built = run.built
    node = built.factory.place_engine_again(index, gone)
    if node is not None and node not in built.folders.engine_paths:
        built.folders.engine_paths.update(place_folder(built.start_model_path, [node], ShareMode(run.cfg.ray.share),
                                                       run.cfg.startup_timeout_s))
    return node


def _resync_engine(run: Run, index: int, actor: ActorHandle, resend: bool) -> None:
    run.learners_ready()  # the transport the new engine joins
    try:
        run.built.transport.replace_engine(index, actor, resend)
    except SyncError as err:
        name = run.built.engine_names[index]
        raise EngineLost(f"{name} was re-created but could not get the weights: {err}") from err


def _new_transport(run: Run) -> TransportBase:
    """The plan's weight transport, not yet joined to the actors."""
    cfg = run.cfg
    transport = make_transport(run.plan, cfg, bucket_mb=cfg.sync.bucket_mb, sleep_level=cfg.sync.sleep_level)
    transport.version = run.state.version
    return transport


def _start_transport(run: Run, send: bool = True) -> None:
    """Join the transport to the learner and the engines; with send, its start (the starting weights once: the
    first update's one-off costs here rather than in step 0, and kept engines' weights replaced)."""
    built = run.built
    # ZeRO-3 ranks other than 0 hold only shards: they join every gather while rank 0 sends (colocated IPC: every
    # rank sends to its own GPU's engines)
    try:
        built.transport.setup(built.learner, built.engines, built.engine_names, gatherers=built.zero3_gatherers,
                              ranks=built.learners)
        warm = built.transport.start() if send else None
    except SyncError as err:
        raise RunError(f"weight sync set-up failed: {err}") from err
    run.services.startup["sync_warmup_s"] = warm.seconds if warm else 0.0


def _loop_parts(run: Run, task: Task, renderer: PromptRenderer, stop_ids: list[int]) -> None:
    """The engines' side of the loop, and, resuming, the rollouts the checkpoint kept."""
    built = run.built
    cfg = run.cfg
    built.rollouts = Rollouts(cfg, task, built.tokenizer, renderer, stop_ids, built.keeper,
                              Scorer(task.rewards, cfg.task, cfg.task.reward), run.services.stop)
    built.rollouts.transport = built.transport
    if built.resume:
        restore_rollouts(run, built.resume)


def tear_down(run: Run, keep: bool = False) -> None:
    """Let a checkpoint being written in the background complete (the learners write it), close the rollouts and
    the transport, and take the actors down (a cluster this process started goes whole). keep (a run that ended
    well): where the engines may be kept warm, they and the cluster stay for engine.keep_warm_s instead."""
    built = run.built

    try:
        finish_background(run)
    except Exception as err:  # noqa: BLE001 - the run is ending anyway; the checkpoints before it are whole
        log.warning("the checkpoint written in the background did not complete: %s", err)
    if built.rollouts is not None:
        built.rollouts.close()
    if built.transport is not None:
        built.transport.close()
    kept_kind = built.factory is not None and built.factory.warm and run.plan.engine.keeps_warm  # KeepsWarm
    if keep and kept_kind and _keep_engines(run):
        return
    release([*built.engines, *built.learners], built.pgs, built.started_ray)


def _keep_engines(run: Run) -> bool:
    """Keep the engines for the next run, stop the learners, and leave the cluster to its head until
    engine.keep_warm_s from now (runtime.cluster.kept_engines). False, with nothing kept, where an engine could
    not be kept."""
    services = run.services
    built = run.built
    import ray

    try:
        kept_engines.keep_for_next_run(built.engines, services.waiter.get)
    except Exception as err:  # noqa: BLE001 - not keeping them is always safe
        log.info("the engines were not kept warm", exc_info=err)  # the detail in run.log; one line here
        services.console.print(f"[yellow]note:[/] the engines were not kept warm ({escape(str(short(err)))}); the next run "
                               "starts them afresh.", highlight=False)
        return False
    for learner in built.learners:  # they end with the driver anyway; now frees their memory before the next run
        with contextlib.suppress(Exception):
            ray.kill(learner)
    if not keep_local(time.time() + run.cfg.engine.keep_warm_s):
        return False
    n = len(built.engines)
    services.console.print(f"kept {n} engine{'s' if n != 1 else ''} warm for {run.cfg.engine.keep_warm_s:.0f} s: the next "
                           "run with these settings starts from them (engine.keep_warm_s=0 stops them with the run; "
                           "a run with other settings stops them first)", highlight=False)
    return True


__all__ = ["Hooks", "Run", "TakeOverFailed", "say_cold_start", "set_up", "take_over_failed", "tear_down"]
