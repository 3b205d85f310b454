"""Set-up, from the plan: a Ray cluster (a local one in a session of its own), one placement group per node, and
the engine and learner actors in their bundles. ``ActorFactory.engine(i)`` is also how a dead engine is
re-created in the same place, or, once ``place_engine_again`` moved its bundle off a node that left, in the new one."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlgen.config import RunConfig, Transport
from rlgen.learners.group import free_endpoint
from rlgen.learners.registry import LEARNERS
from rlgen.learners.sending import PolicySender
from rlgen.plan import Plan
from rlgen.plan.checks.machine import bootstrap_address, cluster_join_mode
from rlgen.plan.checks.machine import cluster_address as ray_address
from rlgen.runtime.cluster import kept_engines, kept_fingerprint
from rlgen.runtime.cluster.bundle_gpus import bundle_gpu_ids, engine_devices, spans_gpus
from rlgen.runtime.cluster.local_ray import (
    SHUTDOWN_S,
    bounded,
    local_cluster,
    ray_shutdown,
    start_local,
    stop_local,
)
from rlgen.runtime.cluster.nodes import NODE_ID_LABEL, assign_nodes, cluster_nodes, free_per_node, spare_nodes
from rlgen.runtime.errors import RunError
from rlgen.sync.sender import CONTROL_GROUP, WeightSender

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle
    from ray.util.placement_group import PlacementGroup
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rlgen.plan.placement import ActorPlacement, Placement
    from rlgen.runtime.cluster.local_ray import LocalCluster
    from rlgen.runtime.cluster.waits import Waiter
    from rlgen.runtime.signals import StopFlag

log = logging.getLogger(__name__)
MOVE_TIMEOUT_S = 30.0  # reserving one engine's bundle on a node that has the room for it
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


def start_ray(cfg: RunConfig, plan: Plan, placement: Placement, stop: StopFlag | None = None,
              keep_warm: bool = False) -> bool:
    """Join the cluster at ray.address (or RAY_ADDRESS), in its token mode (plan.checks.ray_token), or start a
    fresh local one sized for the plan (after stopping what runs that died left of theirs, and clusters kept warm
    for other settings). keep_warm: take over a local cluster kept warm for these settings
    (runtime.cluster.kept_engines) where there is one. True if this process connected (and so disconnects at the
    end). A stop requested while the local cluster starts raises StopRequested."""
    import ray

    if ray.is_initialized():
        return False
    no_auto_connect()
    address = ray_address(cfg)
    if not address:
        need_cpus = sum(sum(b.get("CPU", 0) for b in g) for g in placement.groups)
        init = {"num_cpus": int(max(os.cpu_count() or 1, need_cpus + 1)),
                "object_store_memory": 512 * 2**20 if plan.device == "cpu" else None}
        init = {k: v for k, v in init.items() if v is not None}
        key = kept_engines.cluster_key(init, [list(g) for g in placement.groups]) if keep_warm else ""
        seen = kept_fingerprint.of_run(cfg, actor_env(cfg, dict(plan.engine_env))) if keep_warm else None
        start_local(init, cfg.startup_timeout_s, stop, key=key, fingerprint=seen)
        return True
    target = bootstrap_address(address)
    if target is not None and not address.startswith("ray://"):
        problem = cluster_join_mode(target, address)  # the cluster's token mode, as the checks found it
        if problem:
            raise RunError(problem)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
    except getattr(ray.exceptions, "AuthenticationError", ()) as err:  # a token changed since the check
        raise RunError(f"the Ray cluster at {address} refused this machine's authentication token ({err.message}); "
                       "copy the head node's ~/.ray/auth_token here, or set RAY_AUTH_TOKEN=<the cluster's token>."
                       ) from err
    except ConnectionError as err:
        raise RunError(f"could not join the Ray cluster at {address} ({err}); start it with ray start --head, or "
                       "fix ray.address.") from err
    return True


def no_auto_connect() -> None:
    """Turn off Ray's auto-init in this process: a Ray call made while it is not connected (by a thread that
    outlived a run, or before the run has joined its cluster) would quietly start a Ray instance of its own, and
    the run's own ray.init() would then fail as "called twice". Such a call raises instead."""
    from ray._private import auto_init_hook

    auto_init_hook.enable_auto_connect = False


def connect(cfg: RunConfig, plan: Plan, placement: Placement, stop: StopFlag, waiter: Waiter,
            keep_warm: bool = False) -> tuple[bool, list[str], list[PlacementGroup]]:
    """Join or start the cluster, give each plan node its own Ray node, and reserve the bundles there. Returns
    (whether this process connected, the Ray node of each plan node, the placement groups). keep_warm: a local
    cluster whose engines may be kept warm (runtime.cluster.kept_engines): its placement groups are detached and named by the
    cluster's key, and those of a cluster taken over are used again."""

    started = start_ray(cfg, plan, placement, stop, keep_warm)
    stop.rearm()  # ray.init takes SIGTERM for itself; take it back
    node_ids = assign_nodes(placement, cluster_nodes(), ray_address(cfg) or "this machine")
    cluster = local_cluster() if started else None
    key = cluster.key if cluster is not None else ""
    pgs = reserve(placement, node_ids, cfg.startup_timeout_s, lambda refs, what, t: waiter.get(refs, what, t),
                  key=key, again=bool(cluster and cluster.taken_over))
    return started, node_ids, pgs


def warm_cluster() -> LocalCluster | None:
    """The local cluster of this process when its engines may be kept warm (it has a key), else None."""
    cluster = local_cluster()
    return cluster if cluster is not None and cluster.key else None


def ray_session_dir() -> str | None:
    try:
        import ray

        return ray._private.worker._global_node.get_session_dir_path()  # noqa: SLF001 - for the status file
    except Exception:  # noqa: BLE001 - only informative
        return None


def reserve(placement: Placement, node_ids: list[str], timeout_s: float,
            wait: Callable[[list[ObjectRef], str, float], object], key: str = "",
            again: bool = False) -> list[PlacementGroup]:
    """One STRICT_PACK placement group per plan node, pinned to its Ray node, ready within timeout_s. key: the
    groups are detached and named by it (runtime.cluster.kept_engines); again: those of that name are used where they exist."""
    import ray
    from ray.util.placement_group import get_placement_group, placement_group

    def group(i: int, bundles: Sequence[dict[str, float]], node: str) -> PlacementGroup:
        named = {"name": kept_engines.group_name(key, i), "lifetime": "detached"} if key else {}
        if key and again:
            with contextlib.suppress(ValueError):
                return get_placement_group(named["name"])
        return placement_group(list(bundles), strategy="STRICT_PACK",
                               bundle_label_selector=[{NODE_ID_LABEL: node}] * len(bundles), **named)

    pgs = [group(i, bundles, node) for i, (bundles, node) in enumerate(zip(placement.groups, node_ids))]
    try:
        wait([pg.ready() for pg in pgs], "reserving the plan's resources", timeout_s)
    except RunError as err:
        if "did not finish" not in str(err):
            raise
        raise RunError(
            f"Ray could not reserve the resources of the plan within startup_timeout_s={timeout_s:.0f} s "
            f"(bundles: {[list(g) for g in placement.groups]}; cluster has {ray.cluster_resources()}). "
            "Check hardware=<preset> against the machine, or set ray.address to a cluster that has them."
        ) from err
    return pgs


def release(actors: Sequence[ActorHandle | None], pgs: Sequence[PlacementGroup], started_ray: bool) -> None:
    """Take down what a run or a server made. A cluster this process started goes whole (localray); one
    it joined, it leaves (its actors go with the connection); on a cluster another part of this process
    connected to, its actors and placement groups are removed one by one. Every wait is bounded, so a cluster
    that is already gone does not hold the process."""
    import ray

    if started_ray:
        if local_cluster() is not None:
            stop_local()
        else:
            bounded(ray_shutdown, SHUTDOWN_S, "ray.shutdown()")
        return
    if not ray.is_initialized():
        return

    def remove() -> None:
        from ray.util.placement_group import remove_placement_group

        for a in actors:
            if a is not None:
                with contextlib.suppress(Exception):  # best effort on the way out
                    ray.kill(a)
        for pg in pgs:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)

    bounded(remove, SHUTDOWN_S, "removing the run's actors and placement groups")


def actor_env(cfg: RunConfig, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables every actor gets through its runtime env, on whatever node it runs."""
    return {**QUIET_ENV, "RLGEN_CACHE_DIR": str(cfg.cache_dir), **{k: str(v) for k, v in cfg.ray.env_vars.items()},
            **(extra or {})}


PathByNode = str | dict[str, str]


def _at(path: PathByNode | None, node_id: str) -> str | None:
    return path.get(node_id) if isinstance(path, dict) else path


@dataclass
class ActorFactory:
    """Builds engine and learner actors in the plan's bundles. engine_cls/learner_cls and their kwargs come
    from the run's set-up (tests inject stand-ins)."""

    cfg: RunConfig
    plan: Plan
    placement: Placement
    pgs: list[PlacementGroup]
    node_ids: list[str]  # the Ray node of each placement group
    engine_cls: type
    engine_kwargs: dict[str, object]  # passed on to engine_cls
    learner_cls: type
    learner_kwargs: dict[str, object]  # passed on to learner_cls
    warm: bool = False  # engines are detached and named by their settings, to be kept warm (runtime.cluster.kept_engines)
    kept: set[int] = dataclasses.field(default_factory=set)  # engines an earlier run kept warm, taken over (set-up)
    moved: dict[int, tuple[PlacementGroup, str]] = dataclasses.field(default_factory=dict)  # engine -> (its own group, node)
    gpu_ids: dict[tuple[int, int | None], str] | None = None  # colocated TP>1 engines: the GPU Ray gave each learner bundle (bundle_gpus)

    @property
    def device(self) -> str:
        return "cuda" if self.plan.device == "cuda" else "cpu"

    @property
    def threaded_engines(self) -> bool:
        """Engines that answer calls while generate() runs: those whose kind is threaded (vLLM), and any fed over
        NCCL, whose receive_weights() must run beside generate(). The others take calls in order, so weights
        queued before a generate apply first."""
        return self.plan.engine.threaded or self.plan.transport is Transport.nccl

    @property
    def learner_groups(self) -> dict[str, int | dict[str, int]]:
        """A learner that sends weights over NCCL takes one call beside its others, in its "control" concurrency
        group: abort_weight_group(), which frees a broadcast blocked on an engine that died mid-update. Its other
        calls still run one at a time, in order."""
        return {"concurrency_groups": {CONTROL_GROUP: 1}} if self.plan.transport is Transport.nccl else {"max_concurrency": 1}

    def strategy(self, ap: ActorPlacement) -> PlacementGroupSchedulingStrategy:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self.pgs[ap.group], placement_group_bundle_index=ap.bundle)

    def engine_node(self, index: int) -> str:
        if index in self.moved:
            return self.moved[index][1]
        return self.node_ids[self.placement.engines[index].group]

    def engine_strategy(self, index: int) -> PlacementGroupSchedulingStrategy:
        """Where engine ``index`` runs: its bundle in its plan node's group, or the group it was moved to."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if index in self.moved:
            return PlacementGroupSchedulingStrategy(self.moved[index][0], placement_group_bundle_index=0)
        return self.strategy(self.placement.engines[index])

    def engine_bundle(self, index: int) -> dict[str, float]:
        ap = self.placement.engines[index]
        return dict(self.placement.groups[ap.group][ap.bundle])

    def place_engine_again(self, index: int, gone: str) -> str | None:
        """Engine ``index``'s node (``gone``) left the cluster: reserve a bundle of the same shape on another
        alive node with room for it (nodes that hold none of the run's groups first; beside another plan
        node's actors only where it fits in what they left free). The new node, or None where none has room."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        bundle = self.engine_bundle(index)
        held = set(self.node_ids) | {node for _, node in self.moved.values()}
        for node in spare_nodes(bundle, free_per_node(), held, {gone}):
            pg = placement_group([bundle], strategy="STRICT_PACK", bundle_label_selector=[{NODE_ID_LABEL: node}])
            ready, _ = ray.wait([pg.ready()], timeout=MOVE_TIMEOUT_S)
            if not ready:  # taken meanwhile: try the next
                with contextlib.suppress(Exception):
                    remove_placement_group(pg)
                continue
            if index in self.moved:  # the group it was moved to before went with its node
                with contextlib.suppress(Exception):
                    remove_placement_group(self.moved[index][0])
            self.moved[index] = (pg, node)
            self.pgs.append(pg)  # released with the run's groups
            return node
        return None

    def learner_node(self, rank: int) -> str:
        return self.node_ids[self.placement.learners[rank].group]

    def _engine_call(self, index: int, model_path: PathByNode) -> tuple[dict[str, Any], dict[str, Any]]:
        """Engine ``index``'s constructor arguments and actor options (its name among them, where warm)."""
        slot, ap = self.plan.engines[index], self.placement.engines[index]
        env = dict(self.plan.engine_env)  # empty for kinds that take no engine.env
        if spans_gpus(self.plan):  # it asks Ray for no GPU: it is told which GPUs its slot spans
            if self.gpu_ids is None:
                self.gpu_ids = bundle_gpu_ids(self.plan, [self.strategy(ap) for ap in self.placement.learners])
            env["CUDA_VISIBLE_DEVICES"] = engine_devices(self.plan, index, self.gpu_ids)
        # this engine's part of its GPU's memory (engines on one GPU split the engines' share)
        engine_cfg = dataclasses.replace(self.cfg.engine, gpu_memory_utilization=slot.memory_share)
        # the model path and engine config go by position: engine classes name those parameters as they like
        args = dict(model_path=_at(model_path, self.engine_node(index)), engine=engine_cfg, device=self.device,
                    seed=self.cfg.seed + slot.index, name=f"engine{slot.index}", **self.engine_kwargs)
        options: dict[str, Any] = dict(
            num_cpus=ap.num_cpus, num_gpus=ap.num_gpus, scheduling_strategy=self.engine_strategy(index),
            max_concurrency=4 if self.threaded_engines else 1,
            runtime_env={"env_vars": actor_env(self.cfg, env)},
        )
        if self.warm:
            settings = {**args, "options": {k: v for k, v in options.items() if k != "scheduling_strategy"},
                        "bundle": (ap.group, ap.bundle)}
            key = kept_engines.engine_key(self.engine_cls, settings)
            options.update(kept_engines.detached_options(kept_engines.engine_name(args["name"], key)))
        return args, options

    def warm_names(self, model_path: PathByNode) -> list[str]:
        """The name of every engine, where warm."""
        return [self._engine_call(i, model_path)[1]["name"] for i in range(len(self.plan.engines))] if self.warm else []

    def engine(self, index: int, model_path: PathByNode, version: int, cls: type | None = None) -> ActorHandle:
        """Engine ``index`` in its bundle; model_path: one path, or the path on each node. In a cluster whose
        engines may be kept warm (``self.warm``) the engine is detached and named by its settings. cls: the actor
        class, where it is not engine_cls itself but one built on it (runtime.start.early_engines); the name and
        settings stay engine_cls's."""
        import ray

        args, options = self._engine_call(index, model_path)
        if self.warm:
            kept_engines.free_name(options["name"])  # an engine re-created in a run: its predecessor's name
        path, engine_cfg = args.pop("model_path"), args.pop("engine")
        return ray.remote(cls or self.engine_cls).options(**options).remote(path, engine_cfg, version=version, **args)

    def engine_path(self, index: int, model_path: PathByNode) -> str | None:
        """The model path engine ``index`` is given: model_path, or its node's path in it."""
        return _at(model_path, self.engine_node(index))

    def learners(self, model_path: PathByNode, rendezvous: tuple[str, int] | None,
                 **extra: PathByNode | None) -> list[ActorHandle]:
        """Every learner rank in its bundle; model_path and the extra path arguments (resume_from,
        ref_model_path): one path, or the path on each node."""
        import ray

        kwargs = dict(self.learner_kwargs)
        world = len(self.placement.learners)
        if world > 1:
            assert rendezvous is not None
            kwargs.update(world_size=world, master_addr=rendezvous[0], master_port=rendezvous[1])
        nccl = self.plan.nccl_env
        actors = []
        for rank, ap in enumerate(self.placement.learners):
            node = self.learner_node(rank)
            actors.append(
                ray.remote(**self.learner_groups)(self.learner_cls)
                .options(num_cpus=ap.num_cpus, num_gpus=ap.num_gpus, scheduling_strategy=self.strategy(ap),
                         runtime_env={"env_vars": actor_env(self.cfg, nccl)})
                .remote(_at(model_path, node), self.cfg.algo, self.cfg.monitor, seed=self.cfg.seed, device=self.device,
                        rank=rank, name=f"learner{rank}", **kwargs,
                        **{k: _at(v, node) for k, v in extra.items() if v is not None})
            )
        return actors

    def rendezvous_ref(self) -> ObjectRef[tuple[str, int]]:
        """A ref to (address, port) on rank 0's node, for a learner group's torch.distributed rendezvous."""
        import ray

        ap0 = self.placement.learners[0]
        return ray.remote(free_endpoint).options(num_cpus=0, scheduling_strategy=self.strategy(ap0)).remote()


def engine_class(plan: Plan) -> tuple[type, dict[str, object]]:
    """The engine actor class of the plan's engine kind and its extra constructor kwargs (from the kind's spec)."""
    spec = plan.engine
    return spec.actor_class(), spec.actor_kwargs(plan.config, plan.transport, dict(plan.engine_env))


def learner_class(plan: Plan) -> tuple[type, dict[str, object]]:
    """The learner class of the plan's learner kind and its extra constructor kwargs. A learner that feeds
    engines over NCCL or CUDA IPC gets the weight sender's methods (the DeepSpeed learner has them already)."""

    spec = LEARNERS[plan.learner_kind]
    cls = spec.actor_class()
    if plan.transport in (Transport.nccl, Transport.cuda_ipc):

        if not issubclass(cls, WeightSender):
            cls = type(f"{cls.__name__}WithSender", (PolicySender, cls), {})
    return cls, spec.actor_kwargs(plan.config, plan)
