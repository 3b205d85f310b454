"""The one judge of what can run, built once per command: RunConfig -> Plan (build: the engine's spec, the
learner kind, the layout, every value the config left null, each engine's memory share, the weight path, and
the checks with their fixes), Plan -> Ray bundles (placement), the predicted step times and balance (prediction), how `rlgen plan`
shows it (view), and the validation pass every command runs before anything starts (preflight). Nothing here
imports torch, Ray or vLLM."""

from rlgen.config import Transport
from rlgen.plan.build import build_plan, count_params, model_summary
from rlgen.plan.checks.spanning import live_vllm_env
from rlgen.plan.memory import ENGINE_HEADROOM_GIB, GIB
from rlgen.plan.resolved import BatchGeometry, EngineSlot, Layout, LearnerSlot, ModelSummary, Plan, PlanError

__all__ = [
    "ENGINE_HEADROOM_GIB", "GIB", "BatchGeometry", "EngineSlot", "Layout", "LearnerSlot", "ModelSummary", "Plan",
    "PlanError", "Transport", "build_plan", "count_params", "live_vllm_env", "model_summary",
]
