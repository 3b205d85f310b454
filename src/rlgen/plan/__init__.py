"""The one judge of what can run: RunConfig -> Plan (build), Plan -> Ray bundles (placement), the predicted
balance (planner), how `rlgen plan` shows it (view), and the validation pass every command runs before
anything starts (preflight). Nothing here imports torch, Ray or vLLM."""

from rlgen.plan.build import (
    ENGINE_HEADROOM_GIB,
    GIB,
    BatchGeometry,
    EngineSlot,
    LearnerSlot,
    ModelSummary,
    Plan,
    PlanError,
    Transport,
    build_plan,
    count_params,
    live_vllm_env,
)

__all__ = [
    "ENGINE_HEADROOM_GIB", "GIB", "BatchGeometry", "EngineSlot", "LearnerSlot", "ModelSummary", "Plan", "PlanError",
    "Transport", "build_plan", "count_params", "live_vllm_env",
]
