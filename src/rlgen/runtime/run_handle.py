"""The Run: a run that is set up, in three parts with their own lifetimes. ``Built`` is what set-up builds (the
placement, the actors, the transport, the model's paths and tokenizer), frozen once set-up is done; ``RunState``
(runtime.state.run_state) is what changes while the run runs and a checkpoint saves; ``Services`` is what the run
reports through and waits with (console, stop flag, waiter, status file, start-up clock, metrics sink). Set-up
(runtime.setup) fills them in, the loop (runtime.loop) and checkpoints (runtime.durability.checkpoint) work on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from rlgen.config import RunConfig
from rlgen.plan import Plan
from rlgen.runtime.cluster.actors import ActorFactory, ray_session_dir
from rlgen.runtime.cluster.learner_group import LearnerGroup
from rlgen.runtime.cluster.waits import Waiter
from rlgen.runtime.durability.resume import ResumePoint
from rlgen.runtime.rollouts.engine_restarts import EngineKeeper
from rlgen.runtime.rollouts.generation import Rollouts
from rlgen.runtime.signals import StopFlag
from rlgen.runtime.start.on_thread import Beside
from rlgen.runtime.start.progress import StartupClock
from rlgen.runtime.state.run_state import RunState

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle
    from ray.util.placement_group import PlacementGroup
    from transformers import PreTrainedTokenizerBase

    from rlgen.algo.registry import Algorithm
    from rlgen.metrics.sink import MetricsSink
    from rlgen.plan.placement import Placement
    from rlgen.runtime.durability.shared_folders import RunFolders
    from rlgen.runtime.durability.status_file import RunStatus
    from rlgen.sync.transports.base import TransportBase
    from rlgen.types import JSONDict

# the learner ranks' health refs, their names and when each was asked for: waited for beside the first batch
LearnersToWait = tuple[list["ObjectRef[JSONDict]"], list[str], dict[str, float]]


@dataclass(slots=True)
class Built:
    """What set-up builds for a run, filled in as it starts each piece and frozen once it is done (``freeze``):
    setting a field afterwards raises AttributeError. The objects it holds keep their own state (the engine
    keeper re-creates an engine, the transport counts versions)."""

    resume: ResumePoint | None = None  # the checkpoint this run resumes from
    placement: Placement | None = None  # the plan's bundles, one placement group per node
    pgs: list[PlacementGroup] = field(default_factory=list)
    node_ids: list[str] = field(default_factory=list)
    started_ray: bool = False
    taken_over: bool = False  # its cluster was kept warm by an earlier run and taken over (runtime.cluster.kept_engines)
    folders: RunFolders | None = None  # where each node reads the model, who writes checkpoints
    factory: ActorFactory | None = None
    learners: list[ActorHandle] = field(default_factory=list)  # every rank, rank 0 first (it speaks for the group)
    zero3_gatherers: list[ActorHandle] = field(default_factory=list)  # ZeRO-3: ranks but 0 join each gather
    engine_names: list[str] = field(default_factory=list)
    keeper: EngineKeeper | None = None
    transport: TransportBase | None = None
    rollouts: Rollouts | None = None
    tokenizer: PreTrainedTokenizerBase | None = None
    pad_id: int = 0
    algorithm: Algorithm | None = None  # algo.advantage and algo.policy_loss
    initial_model_path: str = ""  # the starting model; the frozen reference stays this one on resume
    start_model_path: str = ""  # what the actors load: the initial model, or the checkpoint's policy
    teacher_path: str = ""  # on-policy distillation's teacher folder (algo.teacher's, or its preset's build)
    start_version: int = 0  # the policy version the engines start at (a re-created engine too)
    learners_to_wait: LearnersToWait | None = None  # learners set_up does not wait for: they start beside
    learners_pending: Beside[None] | None = None  # the learners and transport, set up beside the first batch
    frozen: bool = False

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "frozen", False):
            raise AttributeError(f"the run is set up: what set-up built cannot change (Built.{name})")
        object.__setattr__(self, name, value)

    def freeze(self) -> None:
        self.frozen = True

    @property
    def engines(self) -> list[ActorHandle]:
        return self.keeper.engines if self.keeper else []

    @property
    def learner(self) -> ActorHandle | None:
        return self.learners[0] if self.learners else None

    def learners_ready(self, stop: StopFlag) -> None:
        """Wait for the learners and the weight transport where they start beside the first batch; set-up is then
        done and what it built is frozen."""
        if self.learners_pending is not None:
            self.learners_pending.result(stop, "starting the learners and the weight transport")
            self.learners_pending = None
            self.freeze()


@dataclass(slots=True)
class Services:
    """What a run reports through and waits with, for its whole life."""

    console: Console
    stop: StopFlag
    waiter: Waiter
    status: RunStatus | None = None  # status.json, kept up to date with actors and checkpoints
    clock: StartupClock | None = None  # each start-up phase, and each actor's start
    startup: dict[str, float] = field(default_factory=dict)  # setup_s, sync_warmup_s, first_rollout_s
    sink: MetricsSink | None = None  # the metrics sink, once the loop runs

    def note_actors(self, health: list[JSONDict]) -> None:
        """Record the actors' pids and nodes in status.json."""
        if self.status is None:
            return
        actors = dict(self.status.data.get("actors", {}))
        actors.update({h["name"]: h.get("pid") for h in health if "name" in h})
        nodes = dict(self.status.data.get("actor_nodes", {}))
        nodes.update({h["name"]: h.get("node") for h in health if "name" in h})
        self.status.update(actors=actors, actor_nodes=nodes, ray_session=ray_session_dir())


@dataclass(slots=True)
class Run:
    """A run that is set up: its plan, its folder, and its three parts. Only these five fields can be set on it."""

    plan: Plan
    out_dir: Path
    built: Built
    state: RunState
    services: Services

    @property
    def cfg(self) -> RunConfig:
        return self.plan.config

    @property
    def learner_group(self) -> LearnerGroup:
        """The learner ranks as one group for a step's phases (runtime.cluster.learner_group)."""
        return LearnerGroup(self.built.learners, self.plan.mesh, self.services.waiter, self.built.folders.learner_nodes,
                            self.cfg.runtime.hang_timeout_s)

    def learners_ready(self) -> None:
        self.built.learners_ready(self.services.stop)


__all__ = ["Built", "LearnersToWait", "Run", "Services"]
