"""Engine faults: an engine actor that dies is re-created in its bundle, brought to the current weights, and
its unfinished requests are sent again. Each engine may die ``engine.max_restarts`` times; one more death
raises EngineLost, which stops the run cleanly."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rlgen.runtime.errors import RunError, actor_death_detail

log = logging.getLogger(__name__)


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


class EngineLost(RunError):
    """An engine died more often than engine.max_restarts allows."""


class EngineKeeper:
    """The engine actors by index, each with its incarnation (how many times it was re-created)."""

    def __init__(self, engines: list[Any], names: list[str], max_restarts: int,
                 create: Callable[[int], Any], ready: Callable[[Any, str], None],
                 resync: Callable[[int, Any], None], say: Callable[[str], None],
                 node_of: Callable[[int], str] | None = None):
        """create(i): a new actor for engine i. ready(actor, what): wait for its health. resync(i, actor): give
        it the current weights (the transport's job). say(msg): one line to the user. node_of(i): the Ray node
        of engine i's bundle (an engine whose node left the cluster cannot come back there)."""
        self.engines, self.names, self.node_of = engines, names, node_of
        self.max_restarts = max_restarts
        self.incarnation = [0] * len(engines)
        self.restarts = [0] * len(engines)
        self._create, self._ready, self._resync, self._say = create, ready, resync, say

    @property
    def total_restarts(self) -> int:
        return sum(self.restarts)

    def replace(self, index: int, err: BaseException) -> None:
        """Engine ``index`` died (err says how): re-create it, or raise EngineLost past max_restarts."""
        import ray

        name, detail = self.names[index], actor_death_detail(err, limit=300)
        if self.node_of is not None:
            from rlgen.runtime.cluster import node_alive

            node = self.node_of(index)
            if not node_alive(node):
                raise EngineLost(f"the node holding {name} ({node[:8]}) left the Ray cluster, and its place in the "
                                 "plan went with it")
        self.restarts[index] += 1
        if self.restarts[index] > self.max_restarts:
            raise EngineLost(
                f"{name} died {_times(self.restarts[index])}, more than engine.max_restarts={self.max_restarts} "
                f"allows (last: {detail})"
            )
        log.info("%s died (%s); re-creating it", name, detail)
        try:
            ray.kill(self.engines[index], no_restart=True)
        except Exception:  # noqa: BLE001 - it is gone already
            pass
        actor = self._create(index)
        self._ready(actor, f"restarting {name}")
        self._resync(index, actor)
        self.engines[index] = actor
        self.incarnation[index] += 1
        self._say(
            f"{name} died ({detail}); restarted it ({self.restarts[index]} of engine.max_restarts="
            f"{self.max_restarts}) with the current weights, and sent its requests again"
        )

    def is_dead(self, index: int, incarnation: int, err: BaseException) -> None:
        """A call to engine ``index`` (sent to ``incarnation``) failed because the actor died: re-create it
        unless that already happened since the call was sent."""
        if incarnation == self.incarnation[index]:
            self.replace(index, err)
