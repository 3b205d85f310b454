"""When the flights ahead of the learner go out (algo.launch_ahead), where the config leaves it null.

With algo.async_steps=k a step's flight and the k after it may generate at once. Launched at the step's start
(``step_start``), the flight ahead shares the engines with the step's own flight while the learner waits for it:
every decode step then carries the new flight's sequences too. Where a flight's sequences are few against the
fixed cost of a decode step (the weights read once, the engine's CPU work of a step), that sharing is nearly free
and the overlap pays. Where they are many, each decode step of the own flight's tail, the last few responses the
learner waits for, takes several times as long beside them, and the learner waits that much longer: the flight
ahead then does better to go out once the step's own flight is in (``own_in``), which keeps the engines as busy
(the learner trains meanwhile) and keeps steps even. The decision reads the plan's decode-step model
(plan.prediction_generation): how many times slower a decode step of few sequences becomes with a whole flight
beside it."""

from __future__ import annotations

import dataclasses
import math

from rlgen.config import LaunchAhead, Setting, set_key
from rlgen.plan.resolved import Plan

# A flight beside the tail that makes its decode steps this many times as long waits for the step's own instead.
# Set from a simulation of the decode-step model behind it (geometric lengths of mean 256 cut at 2,048, k=1, the
# rest of a step about a flight's generation): the two launches gave the same mean step at 256 sequences a step
# (a slowdown of about 5.4); at 64 (2.1) the overlap was a fifth faster, at 512 (9.8) the wait a tenth faster.
SLOWDOWN_OWN_IN = 5.0


def tail_slowdown(plan: Plan) -> float | None:
    """How many times longer a decode step of a few sequences takes with a whole flight's sequences beside it on
    the busiest engine (None: the plan has no decode model for these engines: CPU, no GPU figures, no KV share)."""
    from rlgen.plan.placement import gpu_group
    from rlgen.plan.prediction_generation import decode_split, engine_capacity

    cfg, b = plan.config, plan.batch
    gpu = cfg.hardware.gpu
    if plan.device != "cuda" or not plan.engines or not plan.engine.memory_share or min(
            gpu.hbm_tbps, gpu.bf16_tflops, gpu.memory_gb) <= 0:
        return None
    _, max_conc = engine_capacity(plan, cfg)
    n = len({gpu_group(e) for e in plan.engines})
    seqs = min(max(max_conc, 1), math.ceil(b.prompts_per_step / n) * b.samples_per_prompt)
    fixed, per_seq = decode_split(seqs, b.max_prompt_tokens + b.max_new_tokens / 2, plan, cfg)
    beside = fixed + seqs * per_seq
    return beside / fixed if fixed > 0 else None


def with_launch_ahead(plan: Plan) -> Plan:
    """The plan with algo.launch_ahead filled where the config leaves it null, and its reason in the settings."""
    chosen = plan.config.algo.launch_ahead
    if chosen is not None:
        setting = Setting("algo.launch_ahead", chosen, "config")
    elif plan.async_steps < 1:
        chosen, why = LaunchAhead.step_start, "derived: on-policy (algo.async_steps=0), nothing goes out ahead"
        setting = Setting("algo.launch_ahead", chosen, why)
    else:
        slow = tail_slowdown(plan)
        if slow is not None and slow >= SLOWDOWN_OWN_IN:
            chosen = LaunchAhead.own_in
            why = (f"derived: a flight's sequences beside the one the learner waits for would make its tail's decode "
                   f"steps {slow:.1f}x as long; the next goes out once the step's own is in")
        else:
            chosen = LaunchAhead.step_start
            why = ("derived: no decode-step model for these engines" if slow is None else
                   f"derived: a flight beside the tail makes its decode steps only {slow:.1f}x as long; flights "
                   "ahead go out at the step's start, paced")
        setting = Setting("algo.launch_ahead", chosen, why)
    cfg = set_key(plan.config, "algo.launch_ahead", chosen)
    return dataclasses.replace(plan, config=cfg, settings=plan.settings + (setting,))


__all__ = ["SLOWDOWN_OWN_IN", "tail_slowdown", "with_launch_ahead"]
