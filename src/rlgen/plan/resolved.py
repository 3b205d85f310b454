"""What a plan is: where every engine and learner runs, the batch geometry, the weight path, and the config with
every value it left null resolved. Built once per command by ``rlgen.plan.build``; everything below the plan
reads these fields and derives nothing again."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from rlgen.config import LearnerKind, RunConfig, Setting, Transport, plain
from rlgen.engines.registry import EngineSpec
from rlgen.errors import UserError
from rlgen.mesh import LearnerMesh
from rlgen.plan.disk import DiskWrites
from rlgen.plan.memory import GIB, MemorySplit
from rlgen.plan.teacher import TeacherPlan


class PlanError(UserError, ValueError):
    """The config cannot run. ``problems`` holds one sentence per problem, each with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class Choice:
    """A value the plan chose between candidates, by building the plan with each in turn (best first): the
    first that builds is taken. ``tried`` holds each candidate with the reason it was ruled out ("" for the
    one taken); ``rlgen plan`` shows it."""

    key: str
    chosen: Any
    why: str  # why the first candidate was proposed
    tried: tuple[tuple[Any, str], ...]


class Layout(StrEnum):
    """Where engines sit relative to the learners: the one place this is decided."""

    cpu = "cpu"  # engines and learners are CPU actors of their own
    split = "split"  # engines and learners on GPUs of their own
    colocated = "colocated"  # engines share the learners' GPUs
    served = "served"  # the engines are a server's; the run places learners and one small proxy per engine


@dataclass(frozen=True)
class EngineSlot:
    index: int
    node: int
    gpus: tuple[int, ...]  # GPU indices on that node; () on CPU
    tensor_parallel_size: int
    memory_share: float | None = None  # this engine's gpu_memory_utilization (its part, when engines share a GPU)
    per_gpu: int = 1  # engines on this engine's GPU, this one included (engine.engines_per_gpu)


@dataclass(frozen=True)
class LearnerSlot:
    rank: int
    node: int
    gpu: int | None  # None on CPU


@dataclass(frozen=True)
class BatchGeometry:
    prompts_per_step: int
    samples_per_prompt: int
    sequences_per_step: int
    learner_ranks: int
    sequences_per_rank: int
    max_prompt_tokens: int
    max_new_tokens: int
    max_seq_len: int  # prompt + response


@dataclass(frozen=True)
class ModelSummary:
    name: str
    params: int
    vocab_size: int
    weight_gib_bf16: float
    kv_bytes_per_token: int  # bf16, all layers, before tensor parallelism


@dataclass(frozen=True)
class Plan:
    config: RunConfig  # the config with every value it left null filled in: what every actor runs with
    engine: EngineSpec  # the engine kind and what it can do
    learner_kind: LearnerKind  # torch or deepspeed (auto resolved)
    layout: Layout
    device: str  # "cpu" | "cuda"
    hardware: str
    nodes: int
    gpus_per_node: int
    engines: tuple[EngineSlot, ...]
    learners: tuple[LearnerSlot, ...]
    transport: Transport
    batch: BatchGeometry
    model: ModelSummary
    async_steps: int  # at the start; the run's own value (runtime.state.run_state.RunState) may drop to 0 on drift
    engine_env: dict[str, str]  # passed to the engine actors of kinds that take engine.env
    warnings: tuple[str, ...]
    settings: tuple[Setting, ...] = ()  # the values the config left null (auto), filled, and every one's source
    memory: MemorySplit | None = None  # per GPU: the engine's share, the learner's idle and peak footprint
    disk: DiskWrites | None = None  # what the run writes to disk: checkpoints and the rest (None: a server's plan)
    room: dict | None = None  # what the hardware leaves room for (plan.headroom.hardware_room), for the balancer
    choices: tuple[Choice, ...] = ()  # values chosen by building the plan with each candidate (plan.build)
    layout_advice: str = ""  # another layout of this hardware predicted faster, with what to type (plan.layouts)
    layout_ranking: tuple = ()  # plan.layouts.LayoutOption of every layout, fastest first, where the plan chose one
    mesh: LearnerMesh = LearnerMesh()  # the learner ranks as data x sequence (rlgen.mesh)
    teacher: TeacherPlan | None = None  # on-policy distillation's teacher (plan.teacher; None: no distillation)

    @property
    def checkpoint_gib(self) -> float:
        """One checkpoint on disk, GiB (estimated from the model and the learner)."""
        return round(self.disk.checkpoint_bytes / GIB, 3) if self.disk is not None else 0.0

    @property
    def engine_kind(self) -> str:
        return self.engine.kind

    @property
    def colocated(self) -> bool:
        return self.layout is Layout.colocated

    @property
    def engine_leads(self) -> list[int]:
        """For each engine, the learner rank on its first GPU: the rank that drives its CUDA IPC loads (rank 0
        where no rank shares it)."""
        rank_of = {(slot.node, slot.gpu): slot.rank for slot in self.learners}
        return [rank_of.get((e.node, e.gpus[0] if e.gpus else None), 0) for e in self.engines]

    @property
    def nccl_env(self) -> dict[str, str]:
        """engine_env's NCCL_* settings: every process that joins the engines' NCCL groups (learners, a server's
        trainers) runs with them, since NCCL cannot join two processes that differ in NCCL_CUMEM_ENABLE."""
        return {k: v for k, v in self.engine_env.items() if k.startswith("NCCL_")}

    @property
    def engines_awake(self) -> bool:
        """Colocated engines that stay awake while the learner trains (async_steps > 0): they generate the next
        batch meanwhile and take weight updates in flight. Otherwise colocated engines sleep meanwhile."""
        return self.colocated and self.engine.in_flight_updates and self.async_steps > 0

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON values (plan.json, `rlgen plan --json`); the config under "config"."""
        d: dict[str, Any] = {"engine_kind": self.engine.kind, "learner_kind": self.learner_kind.value,
                             "layout": self.layout.value, "colocated": self.colocated}
        listed = ("engines", "learners", "settings", "choices")  # tuples of dataclasses
        for name in ("device", "hardware", "nodes", "gpus_per_node", "engines", "learners", "transport", "batch",
                     "model", "async_steps", "engine_env", "warnings", "settings", "memory", "checkpoint_gib", "disk",
                     "room", "choices", "layout_advice"):
            value = getattr(self, name)
            d[name] = plain(asdict(value) if hasattr(value, "__dataclass_fields__") else
                            [asdict(v) for v in value] if name in listed else value)
        d["config"] = plain(self.config)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)


__all__ = ["BatchGeometry", "Choice", "EngineSlot", "LearnerSlot", "Layout", "ModelSummary", "Plan", "PlanError"]
