"""Whether generation overlaps training: ``algo.async_steps`` when the config leaves it null, and the memory
fit that decides it for colocated engines. Pure: no torch.

Left null, async_steps is 1 where engines that take weight updates while they generate (vLLM's) run on GPUs: the next batch is generated while the learner
trains (1.6x the steps per hour split on 2xH200, 1.4-1.9x colocated on one H100; docs/benchmarks.md), and a
colocated engine stays awake beside the learner. When an awake engine and the training learner do not both fit
the GPU, a colocated plan goes back to 0: the engine sleeps while the learner trains. Elsewhere it is 0,
strictly on-policy.

Multi-turn tasks (``task.kind=env``) get 2 there: a batch's last episodes wait on their environment's calls, and
with two batches launched ahead the next one's episodes generate meanwhile. On one H100, with a tool that takes
50-500 ms a call, the engines then kept 0.95-0.97x their single-turn tokens per second, and steps were about
1.2x as fast as at 1 (docs/benchmarks.md, "Tool latency").
"""

from __future__ import annotations

from rlgen.config import RunConfig, Setting, TaskKind, set_key
from rlgen.engines.registry import EngineSpec
from rlgen.plan.memory import MemorySplit, fit_memory

EPISODES_AHEAD = 2  # algo.async_steps derived for multi-turn tasks where engines run ahead
ASLEEP_WHY = ("derived: colocated, and an awake engine and the training learner do not both fit the GPU, so the "
              "engine sleeps while the learner trains (on-policy)")


def runs_ahead(cfg: RunConfig, spec: EngineSpec) -> bool:
    """Whether engines run ahead of the learner here by default: engines on GPUs that take weight updates while
    they generate. Elsewhere (every CPU run) the plan stays on-policy, and the balancer advises no other."""
    return spec.in_flight_updates and cfg.hardware.gpus_per_node > 0


def default_async_steps(cfg: RunConfig, spec: EngineSpec, colocated: bool) -> Setting:
    """The value and reason for algo.async_steps left null, before memory is fitted."""
    if runs_ahead(cfg, spec) and cfg.task.kind == TaskKind.env:
        return Setting("algo.async_steps", EPISODES_AHEAD, "derived: multi-turn episodes wait on their environment; "
                       "with two batches launched ahead, the next one's episodes generate meanwhile")
    if runs_ahead(cfg, spec):
        why = ("derived: colocated vLLM engines stay awake and generate the next batch while the learner trains"
               if colocated else "derived: engines on their own GPUs generate the next batch while the learner trains")
        return Setting("algo.async_steps", 1, why)
    return Setting("algo.async_steps", 0, "derived: on-policy (generation overlaps training only for engines on GPUs "
                   "that take weight updates while they generate, such as vLLM's)")


def check_sleep_mode(cfg: RunConfig, spec: EngineSpec, colocated: bool, p: list[str]) -> None:
    """Colocated engines that sleep while the learner trains (async_steps=0) need vLLM's sleep mode."""
    if colocated and spec.sleeps and cfg.algo.async_steps == 0 and not cfg.engine.enable_sleep_mode:
        p.append(
            "colocated engines with algo.async_steps=0 free the GPU while the learner trains, which needs vLLM "
            "sleep mode; set engine.enable_sleep_mode=true, set algo.async_steps=1 (the engine stays awake and "
            "generates the next batch meanwhile), or give engines their own GPUs (hardware.colocated=false)."
        )


def fit_with_overlap(cfg: RunConfig, spec: EngineSpec, model, ranks: int, per_rank: int, colocated: bool,
                     derived: Setting | None, p: list[str]) -> tuple[RunConfig, list[Setting], MemorySplit | None]:
    """fit_memory, with async_steps' derived Setting (None: the config set it) first in the settings. A derived
    awake engine that does not fit beside the learner is fitted again asleep (async_steps=0)."""
    head = [derived] if derived else []
    trial: list[str] = []
    fitted_cfg, fitted, memory = fit_memory(cfg, spec, model, ranks, per_rank, colocated, trial)
    if not (trial and derived and colocated and cfg.algo.async_steps > 0):
        p += trial
        return fitted_cfg, head + fitted, memory
    cfg = set_key(cfg, "algo.async_steps", 0)
    check_sleep_mode(cfg, spec, colocated, p)
    fitted_cfg, fitted, memory = fit_memory(cfg, spec, model, ranks, per_rank, colocated, p)
    return fitted_cfg, [Setting("algo.async_steps", 0, ASLEEP_WHY), *fitted], memory


__all__ = ["EPISODES_AHEAD", "check_sleep_mode", "default_async_steps", "fit_with_overlap", "runs_ahead"]
