"""A run's start-up, phase by phase: what it is doing is said as it begins ("start-up at 0.8 s: model folder",
seconds after launch), a wait on actors says every PROGRESS_S which ones are not ready yet, and when each phase
began and the seconds it took (and each actor's own start, from its health report) go into summary.json and the
closing report, whose "at" column is the same clock as the lines said as the phases began."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from rlgen import launched_at

if TYPE_CHECKING:
    from rlgen.types import JSONDict

PROGRESS_S = 15.0  # a start-up wait says who it waits for this often: never a silent minute
LAUNCH = "launch to set-up (imports, config, plan)"
FIRST_BATCH = "first batch (generate, score)"


class StartupClock:
    def __init__(self, console: Console, launched: float | None = None):
        self.console, self.launched = console, launched_at() if launched is None else launched
        self.phases: dict[str, float] = {}  # seconds each phase took
        self.began: dict[str, float] = {}  # when each phase began, in seconds after launch (as it was said)
        self.actors: dict[str, JSONDict] = {}  # each actor's own start
        self.first_rollout_s: float | None = None
        self._setup_end: float | None = None

    def since_launch(self) -> float:
        return time.time() - self.launched

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one phase; say it as it begins. The first phase also records the time from launch to it."""
        end = self.begin(name)
        try:
            yield
        finally:
            end()

    def begin(self, name: str, beside: bool = False) -> Callable[[], None]:
        """Begin timing a phase (said now, listed in the order phases begin); the function returned ends it, from
        any thread, so phases that run at once are each timed. beside: a phase that goes on beside the first
        batch (its end is not the end of set-up)."""
        if not self.phases:
            self.phases[LAUNCH], self.began[LAUNCH] = self.since_launch(), 0.0
        at = self.since_launch()
        self.began.setdefault(name, at)
        self.console.print(f"[dim]start-up at {at:5.1f} s:[/] {name}", highlight=False)
        before, t0 = self.phases.setdefault(name, 0.0), time.time()

        def end() -> None:
            self.phases[name] = before + time.time() - t0
            if not beside:
                self._setup_end = time.time()

        return end

    def waiting(self, names: list[str], doing: list[str] | None = None) -> Callable[[float, list[int]], None]:
        """A progress callback for Waiter.get over actors named `names` (in the refs' order); doing[i]: what actor
        i does while it starts, in words (its kind's, EngineSpec.start_words), said for the ones still pending."""
        def say(elapsed: float, pending: list[int]) -> None:
            who = ", ".join(names[i] for i in pending[:6]) + (f" and {len(pending) - 6} more" if len(pending) > 6 else "")
            what = "".join(f"; {w}" for w in dict.fromkeys(doing[i] for i in pending if doing[i])) if doing else ""
            self.console.print(f"[dim]start-up at {self.since_launch():5.1f} s:[/] waiting for {who} ({elapsed:.0f} s "
                               f"so far{what})", highlight=False)
        return say

    def actor(self, health: JSONDict, launched_at: float) -> None:
        """One actor's start from its health report: when its process started and its constructor ran (seconds
        after launch), and its own steps."""
        s = health.get("startup") or {}
        name = health.get("name")
        if not name or not s.get("init_end"):
            return

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - self.launched, 3)

        self.actors[name] = {
            "asked_s": rel(launched_at), "process_start_s": rel(s.get("process_start")),
            "init_begin_s": rel(s.get("init_begin")), "ready_s": rel(s.get("init_end")),
            "init_s": round(s["init_end"] - s["init_begin"], 3),
            "steps": {k: round(v, 3) for k, v in (s.get("steps") or {}).items()},
            "parts": {k: round(v, 3) for k, v in (s.get("parts") or {}).items()},
        }
        if health.get("kept_warm"):  # an engine an earlier run kept warm: how many runs have taken it over
            self.actors[name]["kept_warm"] = health["kept_warm"]
        # a vLLM engine's: its KV cache given, stored or measured; fork or spawn; its sampler warm-up's sampling
        for key in ("kv_size", "core_start", "sampler_warmup"):
            if isinstance(health.get(key), str):
                self.actors[name][key] = health[key]

    def first_batch(self) -> None:
        if self.first_rollout_s is None:
            self.first_rollout_s = self.since_launch()
            if self._setup_end is not None:
                self.phases[FIRST_BATCH] = time.time() - self._setup_end
                self.began[FIRST_BATCH] = self._setup_end - self.launched

    def to_dict(self) -> JSONDict:
        return {"phases": {k: round(v, 3) for k, v in self.phases.items()},
                "began": {k: round(v, 3) for k, v in self.began.items()}, "actors": self.actors,
                "first_rollout_s": None if self.first_rollout_s is None else round(self.first_rollout_s, 3)}


def print_startup(startup: JSONDict, console: Console) -> None:
    """The start-up report: each phase and each actor's own start, when it began (at, in seconds after launch,
    as the lines said while the run started) and the seconds it took."""
    phases = startup.get("phases") or {}
    if not phases:
        return
    began = startup.get("began") or {}
    t = Table(title="start-up (at: seconds after launch; took: seconds)", title_justify="left")
    t.add_column("phase")
    t.add_column("at", justify="right")
    t.add_column("took", justify="right")
    for name, seconds in phases.items():
        t.add_row(name, _at(began.get(name)), f"{seconds:.1f}")
    for name, a in (startup.get("actors") or {}).items():
        steps = ", ".join(f"{k} {v:.1f}" for k, v in a["steps"].items())
        parts = ", ".join(f"{k} {v:.1f}" for k, v in a["parts"].items())
        wait = (a["init_begin_s"] - a["asked_s"]) if a.get("asked_s") is not None and a.get("init_begin_s") else None
        t.add_row(f"  {name}: " + ("; ".join(x for x in (steps, parts and f"of which {parts}") if x) or "started")
                  + (f" (began {wait:.1f} s after it was asked for)" if wait is not None else ""),
                  _at(a.get("init_begin_s")), f"{a['init_s']:.1f}")
    if startup.get("first_rollout_s") is not None:
        t.add_row("[bold]time to first rollout[/]", f"[bold]{startup['first_rollout_s']:.1f}[/]", "")
    console.print(t)


def _at(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f}"


__all__ = ["PROGRESS_S", "StartupClock", "print_startup"]
