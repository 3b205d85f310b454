"""When a flight launched ahead of the learner goes out, so that steps do not alternate.

With ``algo.async_steps=k`` the flight of step s+k is launched when step s begins, the earliest moment its weights
(version s) exist. A generation-bound step s then ends ``D + TP`` after step s-k-1 ended, where D is a flight's
generation (launch to its last result) and TP the rest of a step (scoring, training, the weight push). So the steps
form k+1 chains, each of period D + TP, and nothing sets their phases apart: they keep the phases the first steps
gave them. The run's first batch generates alone (the first rollout comes soonest so), the second is launched only
when the first is back, and so, with k=1, the two chains start TP apart: steps alternate between TP and D for the
whole run, where even steps would each take (D + TP) / 2 at the same throughput. Noise moves the phases too.

The pace gives the chains back their spacing: a flight ahead of the step's own goes out no earlier than
``PACE_SHARE * (D + TP) / (k + 1)`` after the flight before it, with D and TP the medians of the last few steps
measured on the driver's clock (a median: one step's evaluation or refill does not move it). It only ever holds a launch back, within the step's own wait: a training-bound
run (D < TP) is never held, since its launches are farther apart than that already, and once the step's own
flight is in, whatever is held goes out at once. Launching later never changes what a flight holds (its
prompts, seeds and carried groups are fixed by its step) and never its weights (they change only between
steps). Pure Python: no Ray."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

PACE_SHARE = 0.9  # of the even spacing: a little short of it, so noise in D and TP does not hold launches back
PACE_WINDOW = 3  # steps whose D and TP the pace takes the median of


@dataclass
class Pace:
    """The driver's measure of its flights (D: launch to last result) and of the rest of its steps (TP: the
    step's flight collected to the next step's start), and the launch times they give."""

    gen: deque[float] = field(default_factory=lambda: deque(maxlen=PACE_WINDOW))  # D of the last flights
    rest: deque[float] = field(default_factory=lambda: deque(maxlen=PACE_WINDOW))  # TP of the last steps
    last_launch: float | None = None  # when the latest flight went out
    collected_at: float | None = None  # when the latest step's own flight was in

    def launched(self, at: float) -> None:
        self.last_launch = at

    def collected(self, launched_at: float | None, done_at: float, now: float) -> None:
        """The step's own flight is in (now); it went out at launched_at (None: restored from a checkpoint, not
        timed) and its engines were done at done_at."""
        if launched_at is not None and done_at >= launched_at:
            self.gen.append(done_at - launched_at)
        self.collected_at = now

    def step_began(self, now: float) -> None:
        """A step begins: the previous one's rest (TP) is measured."""
        if self.collected_at is not None and now >= self.collected_at:
            self.rest.append(now - self.collected_at)
        self.collected_at = None

    def spacing(self, depth: int) -> float | None:
        """The spacing of launches that keeps depth+1 chains of steps evenly apart (None: not measured yet)."""
        if depth < 1 or not self.gen or not self.rest:
            return None
        d, tp = statistics.median(self.gen), statistics.median(self.rest)
        return PACE_SHARE * (d + tp) / (depth + 1)

    def wait_s(self, depth: int, now: float) -> float:
        """Seconds until the next flight ahead may go out (0: now)."""
        spacing = self.spacing(depth)
        if spacing is None or self.last_launch is None:
            return 0.0
        return max(0.0, self.last_launch + spacing - now)


__all__ = ["PACE_SHARE", "PACE_WINDOW", "Pace"]
