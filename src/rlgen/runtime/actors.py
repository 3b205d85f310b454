"""Set-up, from the plan: a Ray cluster, one placement group per node, and the engine and learner actors in
their bundles. ``ActorFactory.engine(i)`` is also how a dead engine is re-created in the same place."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlgen.config import RunConfig
from rlgen.plan import Plan
from rlgen.runtime.errors import RunError

QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


def start_ray(plan: Plan, placement: Any) -> bool:
    """Join the cluster at RAY_ADDRESS, or start a fresh local one sized for the plan. True if started here."""
    import ray

    if ray.is_initialized():
        return False
    need_cpus = sum(sum(b.get("CPU", 0) for b in g) for g in placement.groups)
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    if not os.environ.get("RAY_ADDRESS"):
        kwargs["address"] = "local"  # a fresh local cluster, never someone else's by accident
        kwargs["num_cpus"] = int(max(os.cpu_count() or 1, need_cpus + 1))
        kwargs["object_store_memory"] = 512 * 2**20 if plan.device == "cpu" else None
    ray.init(**{k: v for k, v in kwargs.items() if v is not None})
    return True


def check_cluster(placement: Any) -> None:
    """The cluster holds the plan's bundles: enough CPUs and GPUs in all, and a node for each node's bundles.
    Raises RunError at once instead of waiting out startup_timeout_s for resources that will never come."""
    import ray

    need: dict[str, float] = {}
    for group in placement.groups:
        for bundle in group:
            for k, v in bundle.items():
                need[k] = need.get(k, 0.0) + v
    have = ray.cluster_resources()
    short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if have.get(k, 0.0) < v}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    biggest = [sum(b.get("GPU", 0.0) for b in g) for g in placement.groups]
    per_node = max((n.get("Resources", {}).get("GPU", 0.0) for n in nodes), default=0.0)
    where = f"at {os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS") else "started here"
    if short:
        what = ", ".join(f"{v:g} {k} (it has {h:g})" for k, (v, h) in short.items())
        raise RunError(f"the Ray cluster {where} cannot hold the plan: it needs {what}; start it on nodes that "
                       "have them, or choose hardware=<preset> that fits the cluster.")
    if biggest and max(biggest) > per_node:
        raise RunError(f"the Ray cluster {where} has no node with {max(biggest):g} GPUs, which one node of the plan "
                       f"needs (its largest node has {per_node:g}); set hardware.gpus_per_node={per_node:g}.")


def ray_session_dir() -> str | None:
    try:
        import ray

        return ray._private.worker._global_node.get_session_dir_path()  # noqa: SLF001 - for the status file
    except Exception:  # noqa: BLE001 - only informative
        return None


def reserve(placement: Any, timeout_s: float, wait: Callable[[list[Any], str, float], Any]) -> list[Any]:
    """One STRICT_PACK placement group per node, ready within timeout_s."""
    import ray
    from ray.util.placement_group import placement_group

    pgs = [placement_group(list(bundles), strategy="STRICT_PACK") for bundles in placement.groups]
    try:
        wait([pg.ready() for pg in pgs], "reserving the plan's resources", timeout_s)
    except RunError as err:
        if "did not finish" not in str(err):
            raise
        raise RunError(
            f"Ray could not reserve the resources of the plan within startup_timeout_s={timeout_s:.0f} s "
            f"(bundles: {[list(g) for g in placement.groups]}; cluster has {ray.cluster_resources()}). "
            "Check hardware=<preset> against the machine, or set RAY_ADDRESS to a cluster that has them."
        ) from err
    return pgs


@dataclass
class ActorFactory:
    """Builds engine and learner actors in the plan's bundles. engine_cls/learner_cls and their kwargs come
    from the orchestrator (tests inject stand-ins)."""

    cfg: RunConfig
    plan: Plan
    placement: Any
    pgs: list[Any]
    engine_cls: type
    engine_kwargs: dict[str, Any]
    learner_cls: type
    learner_kwargs: dict[str, Any]

    @property
    def device(self) -> str:
        return "cuda" if self.plan.device == "cuda" else "cpu"

    def strategy(self, ap: Any) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self.pgs[ap.group], placement_group_bundle_index=ap.bundle)

    def engine(self, index: int, model_path: str, version: int) -> Any:
        import ray

        slot, ap = self.plan.engines[index], self.placement.engines[index]
        return (
            ray.remote(self.engine_cls)
            .options(
                num_cpus=ap.num_cpus,
                num_gpus=ap.num_gpus,
                scheduling_strategy=self.strategy(ap),
                # vLLM engines are threaded, so pause()/receive_weights() can run during generate().
                max_concurrency=4 if self.plan.engine_kind == "vllm" else 1,
            )
            .remote(model_path, self.cfg.engine, device=self.device, seed=self.cfg.seed + slot.index,
                    name=f"engine{slot.index}", version=version, **self.engine_kwargs)
        )

    def learners(self, model_path: str, rendezvous: tuple[str, int] | None, **extra: Any) -> list[Any]:
        import ray

        kwargs = dict(self.learner_kwargs, **extra)
        world = len(self.placement.learners)
        if world > 1:
            assert rendezvous is not None
            kwargs.update(world_size=world, master_addr=rendezvous[0], master_port=rendezvous[1])
        return [
            ray.remote(self.learner_cls)
            .options(num_cpus=ap.num_cpus, num_gpus=ap.num_gpus, scheduling_strategy=self.strategy(ap))
            .remote(model_path, self.cfg.algo, self.cfg.monitor, seed=self.cfg.seed, device=self.device, rank=rank,
                    name=f"learner{rank}", **kwargs)
            for rank, ap in enumerate(self.placement.learners)
        ]

    def rendezvous_ref(self) -> Any:
        """A ref to (address, port) on rank 0's node, for a learner group's torch.distributed rendezvous."""
        import ray

        from rlgen.learners.group import free_endpoint

        ap0 = self.placement.learners[0]
        return ray.remote(free_endpoint).options(num_cpus=0, scheduling_strategy=self.strategy(ap0)).remote()


def engine_class(plan: Plan) -> tuple[type, dict[str, Any]]:
    """The engine class and its extra constructor kwargs for the plan's engine kind."""
    if plan.engine_kind == "hf":
        from rlgen.engines.hf import HFEngine

        return HFEngine, {}
    from rlgen.engines.vllm import VLLMEngine
    from rlgen.sync import engine_args_for

    return VLLMEngine, {"env": dict(plan.engine_env), "engine_args": engine_args_for(plan.transport)}


def learner_class(cfg: RunConfig, plan: Plan) -> tuple[type, dict[str, Any]]:
    """The learner class and its extra constructor kwargs: DeepSpeed on GPUs (or when asked for), torch
    otherwise. The plan has already refused layouts the chosen learner cannot run."""
    kind = cfg.learner.kind.value
    if kind == "deepspeed" or (kind == "auto" and plan.device == "cuda"):
        from rlgen.learners.deepspeed import DeepSpeedLearner

        return DeepSpeedLearner, {
            "zero_stage": cfg.learner.zero_stage,
            "gradient_checkpointing": cfg.learner.gradient_checkpointing,
            "rows_per_step": plan.batch.sequences_per_rank,
            "sync_bucket_bytes": int(cfg.sync.bucket_mb * 2**20),
            "release_memory": bool(plan.colocated),
            "env": {k: v for k, v in plan.engine_env.items() if k.startswith("NCCL_")},
        }
    from rlgen.learners.torch import TorchLearner

    if plan.transport.value != "ray_object_store":  # a torch learner feeding vLLM engines on GPUs
        from rlgen.learners.weight_sender import WeightSender

        return type("TorchSyncLearner", (WeightSender, TorchLearner), {}), {}
    return TorchLearner, {}
