"""Which GPU Ray gave each learner bundle of a colocated plan. A colocated engine over several GPUs (tensor
parallel) sits in its first GPU's bundle and asks Ray for no GPU, since vLLM starts a worker per GPU itself; so
Ray does not narrow the GPUs it sees, and it would take the node's first ones. It is given the GPUs of the
bundles its plan slot spans instead, read here once by a small task in each bundle."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgen.plan import Plan
from rlgen.runtime.errors import RunError

if TYPE_CHECKING:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PROBE_GPU = 0.01  # of a bundle's one GPU; the learner and TP>1 engines leave at least half of it free
PROBE_TIMEOUT_S = 60.0


def spans_gpus(plan: Plan) -> bool:
    """Colocated engines that each span several GPUs: they need the bundles' GPU ids."""
    return plan.colocated and any(e.tensor_parallel_size > 1 for e in plan.engines)


def _accelerator_ids() -> list[str]:
    import ray

    return [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


def bundle_gpu_ids(plan: Plan, learner_strategies: list[PlacementGroupSchedulingStrategy]) -> dict[tuple[int, int | None], str]:
    """(plan node, GPU) -> the id of the GPU Ray reserved for the learner bundle there. learner_strategies:
    each learner rank's scheduling strategy (its bundle)."""
    import ray

    probe = ray.remote(num_cpus=0, num_gpus=PROBE_GPU)(_accelerator_ids)
    refs = [probe.options(scheduling_strategy=s).remote() for s in learner_strategies]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
    if len(ready) < len(refs):
        raise RunError(f"reading which GPU each learner bundle holds took over {PROBE_TIMEOUT_S:.0f} s; the cluster "
                       "is short of CPU or GPU room in the run's placement groups. Check `ray status`.")
    ids: dict[tuple[int, int | None], str] = {}
    for slot, got in zip(plan.learners, ray.get(refs)):
        if len(got) != 1:
            raise RunError(f"learner rank {slot.rank}'s bundle holds GPUs {got}, not one; a colocated plan gives "
                           "each learner rank one GPU.")
        ids[(slot.node, slot.gpu)] = got[0]
    return ids


def engine_devices(plan: Plan, index: int, ids: dict[tuple[int, int | None], str]) -> str:
    """CUDA_VISIBLE_DEVICES for colocated engine ``index``: the GPUs of its slot, in its slot's order."""
    slot = plan.engines[index]
    return ",".join(ids[(slot.node, g)] for g in slot.gpus)


__all__ = ["bundle_gpu_ids", "engine_devices", "spans_gpus"]
