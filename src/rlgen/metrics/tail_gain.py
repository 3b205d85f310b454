"""What carrying the generation tail into the next step (algo.partial_rollouts) would save, predicted from a run's
own tail metrics. Pure Python.

A batch's tail is ``gen/tail_s``: on its longest engine, from when 90% of the engine's requests were done to its
last. It costs the step only where the learner waited for it and nothing else generated meanwhile:

- the learner's wait for its batch (its ``wait`` spans) ends when the batch's last response does, and so does the
  tail, so the part of the tail the learner waited through is min(tail, wait);
- for the share of the tail in which the next batch, launched ahead, was already generating on the engine
  (``gen/tail_filled``), the engine was working on that next batch: cutting the tail gives none of it back.

So, each step and then averaged over the steps::

    saving = min(tail_s, wait_s) x (1 - tail_filled)         gain = mean saving / mean step

Advice is given where the gain is at least PARTIAL_GAIN_FRAC. The model leaves out what carrying costs: the cut
responses decode their last tokens in a later step, beside a full batch, where each adds little to a decode step;
and the cut falls where 1 / (1 + share) of a step's groups are done, somewhat after the tail starts. So the gain
is an upper estimate. With partial rollouts on, the measured tail is the one already cut: it cannot say what the
whole tail would cost, so no advice is drawn from it either way.
"""

from __future__ import annotations

import math

PARTIAL_GAIN_FRAC = 0.10  # carrying the tail is advised where it is predicted to cut the mean step by this share
PARTIAL_SHARE = 0.25  # the algo.partial_rollouts the advice names (and the plan predicts, where the config has none)


def tail_wait_s(tail_s: float, wait_s: float, filled: float) -> float | None:
    """One step's saving: the part of its generation tail the learner waited for and the next batch did not fill;
    None where a figure is not a finite number."""
    if not all(math.isfinite(x) for x in (tail_s, wait_s, filled)):
        return None
    return max(0.0, min(tail_s, wait_s)) * (1.0 - min(max(filled, 0.0), 1.0))


def carry_gain(saving_s: float | None, step_s: float) -> float | None:
    """The share of the mean step that carrying the tail would save (None where the saving is unknown)."""
    if saving_s is None or not step_s > 0:
        return None
    return min(1.0, saving_s / step_s)


def carry_advice(saving_s: float | None, step_s: float) -> tuple[str, str] | None:
    """(what the step waits for, the fix) for a verdict's sentence, where carrying the tail is predicted to cut the
    mean step by at least PARTIAL_GAIN_FRAC; None where it is not, or the tail was not measured."""
    gain = carry_gain(saving_s, step_s)
    if saving_s is None or gain is None or gain < PARTIAL_GAIN_FRAC:
        return None
    return (f"the learner waits {saving_s:.3g} s a step for the generation tail (the last 10% of the responses) with "
            "nothing else generating",
            f"carry the tail into the next step (algo.partial_rollouts={PARTIAL_SHARE:g}; carrying the tail would cut "
            f"the mean step by about {gain:.0%})")


__all__ = ["PARTIAL_GAIN_FRAC", "PARTIAL_SHARE", "carry_advice", "carry_gain", "tail_wait_s"]
