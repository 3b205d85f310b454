"""Every wait on an actor: a timeout, a wake-up every POLL_S to notice a stop request, and an error that
says what failed, on which actor, and how to go on."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rlgen.engines.base import COULD_NOT_START
from rlgen.runtime.cluster.nodes import node_alive, node_name
from rlgen.runtime.errors import RunError, StopRequested, actor_death_detail

log = logging.getLogger(__name__)
POLL_S = 0.25  # waits wake this often to notice a stop request


class LearnerLost(RunError):
    """A learner actor died: its state is gone, so the run stops and resumes from the last checkpoint."""


def short(err: BaseException | None, limit: int = 300) -> str:
    """An exception in one line: its type and the first line of its message."""
    if err is None:
        return "an error"
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}"[:limit] if first else type(err).__name__


def _culprit(refs: list[Any], names: list[str] | None) -> str | None:
    """The name of the first actor whose call failed (refs and names in the same order)."""
    import ray

    if not names:
        return None
    for ref, name in zip(refs, names):
        try:
            ray.get(ref, timeout=0)
        except Exception:  # noqa: BLE001 - this is the failed one
            return name
    return None


class Waiter:
    def __init__(self, timeout_s: float, stop: Any, out_dir: Path):
        self.timeout_s, self.stop, self.out_dir = float(timeout_s), stop, Path(out_dir)

    def get(self, refs: Any, what: str, timeout_s: float | None = None, *, interruptible: bool = True,
            names: list[str] | None = None, progress: Any = None, every_s: float = 15.0) -> Any:
        """ray.get of one ref or a list, within timeout_s (timeout_s of the run by default); interruptible
        waits raise StopRequested once a stop is asked for. names: the actor behind each ref. progress(elapsed,
        pending indices) is called every every_s while refs are pending."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        key = "timeout_s" if timeout_s == self.timeout_s else "startup_timeout_s"
        many = isinstance(refs, list)
        todo = list(refs) if many else [refs]
        start = time.time()
        deadline, said = start + timeout_s, start
        while todo:
            if progress is not None and time.time() - said >= every_s:
                said = time.time()
                pending = {id(r) for r in todo}
                progress(said - start, [i for i, r in enumerate(refs if many else [refs]) if id(r) in pending])
            if interruptible and self.stop.requested:
                raise StopRequested(what)
            left = deadline - time.time()
            if left <= 0:
                raise RunError(
                    f"{what} did not finish within {key}={timeout_s:.0f} s; an actor may be stuck or the step too "
                    f"large. Raise {key}=<seconds> or shrink algo.prompts_per_step."
                )
            _, todo = ray.wait(todo, num_returns=len(todo), timeout=min(POLL_S, left))
        try:
            return ray.get(list(refs) if many else refs)
        except RayActorError as err:
            detail = actor_death_detail(err)
            if COULD_NOT_START in detail:  # an engine that said why: no "died" around it
                raise RunError(f"{what} failed: {detail}") from err
            raise RunError(
                f"{what} failed because an actor died ({detail}). Metrics up to the last finished "
                f"step are in {self.out_dir}."
            ) from err
        except RayTaskError as err:
            log.info("%s raised in an actor", what, exc_info=err)
            who = _culprit(list(refs) if many else [refs], names) or "an actor"
            raise RunError(f"{what}: {who} raised {short(err.cause)}") from err

    def learner_get(self, refs: Any, what: str, names: list[str] | None = None,
                    nodes: list[str] | None = None) -> Any:
        """A learner call: never interrupted (the learner's state must stay whole); a dead learner (nodes: the
        Ray node of each rank) raises LearnerLost."""
        from ray.exceptions import RayActorError

        try:
            return self.get(refs, what, interruptible=False, names=names)
        except RunError as err:
            if isinstance(err.__cause__, RayActorError):

                gone = [f"{node_name(n)} of learner{r}" for r, n in enumerate(nodes or []) if not node_alive(n)]
                why = (f"the node {', '.join(gone)} left the Ray cluster" if gone
                       else actor_death_detail(err.__cause__, limit=300))
                raise LearnerLost(f"{what}: {why}") from err
            raise
