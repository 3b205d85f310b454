"""Engine faults: an engine that dies is re-created in its bundle, brought to the current weights, and its
unfinished requests are sent again. An engine dies in two ways: its actor process dies (RayActorError), or the
engine inside a live actor does (EngineDead: vLLM's engine core exited, or a CUDA error); both are handled the
same way. An engine whose node left the cluster is re-created on another node with room for its bundle, or, where
none has, raises EngineLost. Each engine may die ``engine.max_restarts`` times; one more death raises EngineLost,
which stops the run cleanly with a checkpoint."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlgen.engines.base import EngineDead, engine_died
from rlgen.errors import causes
from rlgen.runtime.cluster.nodes import node_alive, node_name
from rlgen.runtime.errors import RunError, actor_death_detail

if TYPE_CHECKING:
    from ray.actor import ActorHandle

log = logging.getLogger(__name__)
HEALTH_TIMEOUT_S = 30.0  # an engine that does not answer its health check within this is busy, not dead


def death_detail(err: BaseException) -> str:
    """What killed an engine, in a line: the EngineDead sentence where there is one (the innermost: Ray's task
    error is an EngineDead too, with its traceback as text), else Ray's."""
    dead = [e for e in causes(err) if isinstance(e, EngineDead)]
    return str(dead[-1])[:300] if dead else actor_death_detail(err, limit=300)


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


class EngineLost(RunError):
    """An engine died more often than engine.max_restarts allows."""


class EngineKeeper:
    """The engine actors by index, each with its incarnation (how many times it was re-created)."""

    def __init__(self, engines: list[ActorHandle], names: list[str], max_restarts: int,
                 create: Callable[[int], ActorHandle], ready: Callable[[ActorHandle, str], None],
                 resync: Callable[[int, ActorHandle, bool], None], say: Callable[[str], None],
                 node_of: Callable[[int], str] | None = None,
                 place_again: Callable[[int, str], str | None] | None = None):
        """create(i): a new actor for engine i. ready(actor, what): wait for its health. resync(i, actor, resend):
        join it to the weight transport and, with resend, give it the current weights (the transport's job).
        say(msg): one line to the user. node_of(i): the Ray node of engine i's bundle. place_again(i, gone): move
        engine i's bundle off node ``gone`` (it left the cluster) to another node; that node, or None where no
        node has room (then create(i) builds it there)."""
        self.engines, self.names, self.node_of, self._place_again = engines, names, node_of, place_again
        self.max_restarts = max_restarts
        self.incarnation = [0] * len(engines)
        self.restarts = [0] * len(engines)
        self._create, self._ready, self._resync, self._say = create, ready, resync, say

    @property
    def total_restarts(self) -> int:
        return sum(self.restarts)

    def replace(self, index: int, err: BaseException, resync: bool = True) -> None:
        """Engine ``index`` died (err says how): re-create it, or raise EngineLost past max_restarts. resync: give
        it the current weights now (False: the caller is about to push new weights to every engine). A new actor
        that fails to start or to join is taken down again, so it holds no GPU share."""
        import ray

        name, detail = self.names[index], death_detail(err)
        detail = self._move_off_dead_node(index) or detail
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
        actor = self._start(index, resync, again=self.node_of is not None)
        if actor is None:  # its node was dying, not yet marked dead when the engine's calls broke: move it now
            detail = self._move_off_dead_node(index) or detail
            actor = self._start(index, resync, again=False)
        self.engines[index] = actor
        self.incarnation[index] += 1
        self._say(
            f"{name} died ({detail}); restarted it ({self.restarts[index]} of engine.max_restarts="
            f"{self.max_restarts}) with the current weights, and sent its requests again"
        )

    def _start(self, index: int, resync: bool, again: bool) -> ActorHandle | None:
        """A new actor for engine ``index``, healthy and joined (resync: with the current weights). One that fails
        is taken down again, so it holds no GPU share; with ``again``, None where its node has left meanwhile."""
        import ray

        actor = self._create(index)
        try:
            self._ready(actor, f"restarting {self.names[index]}")
            self._resync(index, actor, resync)
        except BaseException:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
            if again and not node_alive(self.node_of(index)):
                return None
            raise
        return actor

    def _move_off_dead_node(self, index: int) -> str:
        """Where engine ``index``'s node left the cluster: its bundle placed on another node (what happened, in a
        few words), or EngineLost naming the node where no node has room. "" where its node is alive."""
        if self.node_of is None:
            return ""
        gone = self.node_of(index)
        if node_alive(gone):
            return ""
        held = [n for i, n in enumerate(self.names) if self.node_of(i) == gone]
        new = self._place_again(index, gone) if self._place_again is not None else None
        if new is None:
            raise EngineLost(
                f"the node {node_name(gone)} left the Ray cluster with {', '.join(held)} on it, and no other node has "
                f"room for {self.names[index]}; resume=auto continues the run once the cluster has the resources again"
            )
        log.info("%s's node %s left the cluster; placing it on %s", self.names[index], gone, new)
        return f"its node {node_name(gone)} left the Ray cluster; placed again on {node_name(new)}"

    def find_dead(self) -> list[int]:
        """The engines whose actor or engine is gone, by asking each for its health (a busy engine that does not
        answer in time counts as alive)."""
        import ray

        refs = [e.health.remote() for e in self.engines]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=HEALTH_TIMEOUT_S)
        dead = []
        for i, ref in enumerate(refs):
            if ref not in ready:
                continue
            try:
                if not ray.get(ref).get("ok", True):
                    dead.append(i)
            except Exception as err:  # noqa: BLE001 - an actor that cannot answer
                if engine_died(err):
                    dead.append(i)
        return dead

    def replace_dead(self, err: BaseException, resync: bool = True) -> bool:
        """After a call over several engines failed with err (a weight update): re-create the engines that are
        gone (resync: with the current weights). False when err was not an engine's death, or no engine is gone
        (the caller raises err then)."""
        if not engine_died(err):
            return False
        dead = self.find_dead()
        for i in dead:
            self.replace(i, err, resync)
        return bool(dead)

    def is_dead(self, index: int, incarnation: int, err: BaseException) -> None:
        """A call to engine ``index`` (sent to ``incarnation``) failed because the actor died: re-create it
        unless that already happened since the call was sent."""
        if incarnation == self.incarnation[index]:
            self.replace(index, err)
