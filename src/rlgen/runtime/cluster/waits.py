"""Every wait on an actor: a timeout, a wake-up every POLL_S to notice a stop request, and an error that
says what failed, on which actor, and how to go on."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, overload

from rlgen.engines.base import COULD_NOT_START
from rlgen.learners.group import CollectiveFailed
from rlgen.runtime.cluster.nodes import node_alive
from rlgen.runtime.errors import RunError, StopRequested, actor_death_detail

if TYPE_CHECKING:
    from ray import ObjectRef

    from rlgen.plan.env_bound import EnvBound
    from rlgen.runtime.signals import StopFlag

T = TypeVar("T")
# progress(seconds waited, the indices of the refs still pending)
Progress = Callable[[float, list[int]], None]
# an outcome of one call: "ok" | "dead" | "raised" | "collective" | "pending", and its error
Outcome = tuple[str, BaseException | None]

log = logging.getLogger(__name__)
POLL_S = 0.25  # waits wake this often to notice a stop request


class LearnerLost(RunError):
    """Learner ranks died (hung=False) or did not finish a collective in time (hung=True): the run stops. ranks:
    the lost ranks; the others, if any, may stand in for them (rlgen.runtime.durability.learner_loss)."""

    def __init__(self, message: str, *, ranks: list[int] | None = None, hung: bool = False):
        super().__init__(message)
        self.ranks, self.hung = list(ranks or []), bool(hung)


def did_not_finish(what: str, key: str, timeout_s: float, env: EnvBound | None = None) -> str:
    """The sentence for a wait that ran past its timeout. env: the bound on the environment calls of the episodes
    it waited for; where that reaches the timeout, they are why, and the sentence names the settings that
    shorten them."""
    if env is not None and env.seconds >= timeout_s:
        return (f"{what} did not finish within {key}={timeout_s:.0f} s: its episodes' environment calls alone may "
                f"take up to {env.words()}; lower task.env_timeout_s, raise task.env_workers, or raise {key} above "
                f"{env.seconds:.0f}.")
    said = f"{what} did not finish within {key}={timeout_s:.0f} s; an actor may be stuck or the step too large"
    if env is not None:
        said += f" (its episodes' environment calls take up to {env.words()} of it)"
    return f"{said}. Raise {key}=<seconds> or shrink algo.prompts_per_step."


def short(err: BaseException | None, limit: int = 300) -> str:
    """An exception in one line: its type and the first line of its message."""
    if err is None:
        return "an error"
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}"[:limit] if first else type(err).__name__


def _culprit(refs: Sequence[ObjectRef], names: list[str] | None) -> str | None:
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
    def __init__(self, timeout_s: float, stop: StopFlag, out_dir: Path):
        self.timeout_s, self.stop, self.out_dir = float(timeout_s), stop, Path(out_dir)

    @overload
    def get(self, refs: ObjectRef[T], what: str, timeout_s: float | None = None, *, interruptible: bool = True,
            names: list[str] | None = None, progress: Progress | None = None, every_s: float = 15.0) -> T: ...

    @overload
    def get(self, refs: list[ObjectRef[T]], what: str, timeout_s: float | None = None, *, interruptible: bool = True,
            names: list[str] | None = None, progress: Progress | None = None, every_s: float = 15.0) -> list[T]: ...

    def get(self, refs: ObjectRef[T] | list[ObjectRef[T]], what: str, timeout_s: float | None = None, *,
            interruptible: bool = True, names: list[str] | None = None, progress: Progress | None = None,
            every_s: float = 15.0) -> T | list[T]:
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
                raise RunError(did_not_finish(what, key, timeout_s))
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

    def learner_get(self, refs: Sequence[ObjectRef[T]], what: str, names: list[str] | None = None,
                    nodes: list[str] | None = None, hang_s: float | None = None,
                    ranks: list[int] | None = None) -> list[T]:
        """A call on every learner rank (refs in rank order): never interrupted (the learner's state must stay
        whole). A dead rank (nodes: the Ray node of each rank) raises LearnerLost at once. hang_s: once a rank
        has finished, the others must finish within hang_s; a rank whose collective timed out, or one still
        running after that, marks the ranks still running as hung (LearnerLost with hung=True). ranks: the rank
        of each ref (default 0, 1, ...)."""
        import ray

        refs = list(refs)
        start = time.time()
        deadline, hang_at = start + self.timeout_s, None
        todo = list(refs)
        outcomes: list[Outcome] = [("pending", None)] * len(refs)
        index = {r: i for i, r in enumerate(refs)}
        while todo:
            ready, todo = ray.wait(todo, num_returns=len(todo), timeout=POLL_S)
            for ref in ready:  # each call's outcome once, as it finishes
                outcomes[index[ref]] = _outcome(ref)
            kinds = {k for k, _ in outcomes}
            if "dead" in kinds or "raised" in kinds or (todo and any(_timed_out(e) for _, e in outcomes)):
                break  # the group cannot finish this call: a rank died, raised, or a collective timed out
            if hang_s is not None and hang_at is None and len(todo) < len(refs):
                hang_at = time.time() + hang_s  # a rank finished: the others are past the collective too
            if todo and hang_at is not None and time.time() >= hang_at:
                break
            if todo and time.time() >= deadline:
                raise RunError(f"{what} did not finish within timeout_s={self.timeout_s:.0f} s; a learner may be "
                               "stuck or the step too large. Raise timeout_s=<seconds> or shrink "
                               "algo.prompts_per_step.")
        return _ranks_result(refs, outcomes, what, names, nodes, hang_s, ranks or list(range(len(refs))))


def _outcome(ref: ObjectRef) -> Outcome:
    """("ok" | "dead" | "raised" | "pending", the error) of one call, without waiting."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        ray.get(ref, timeout=0)
    except GetTimeoutError:
        return "pending", None
    except RayActorError as err:
        return "dead", err
    except RayTaskError as err:
        return ("collective" if isinstance(err.cause, CollectiveFailed) else "raised"), err
    return "ok", None


def _timed_out(err: BaseException | None) -> bool:
    cause = getattr(err, "cause", None)
    return isinstance(cause, CollectiveFailed) and cause.timed_out


def _ranks_result(refs: list[ObjectRef[T]], outcomes: list[Outcome], what: str, names: list[str] | None,
                  nodes: list[str] | None, hang_s: float | None, ranks: list[int]) -> list[T]:
    """The ranks' results, or the error that says which rank failed and how (i: a ref's index)."""
    import ray

    where = [node_address(n) for n in (nodes or [])]

    def rank(i: int) -> str:
        return f"learner rank {ranks[i]}" + (f" on node {where[i]}" if i < len(where) and where[i] else "")

    dead = [i for i, (k, _) in enumerate(outcomes) if k == "dead"]
    if dead:
        i, err = dead[0], outcomes[dead[0]][1]
        gone = i < len(nodes or []) and not node_alive((nodes or [])[i])
        why = "its node left the Ray cluster" if gone else actor_death_detail(err, limit=300)
        raise LearnerLost(f"{rank(i)} died during {what} ({why})", ranks=[ranks[j] for j in dead]) from err
    raised = [(i, e) for i, (k, e) in enumerate(outcomes) if k == "raised"]
    if raised:
        i, err = raised[0]
        log.info("%s raised in learner rank %d", what, ranks[i], exc_info=err)
        who = names[i] if names else f"learner{ranks[i]}"
        raise RunError(f"{what}: {who} raised {short(getattr(err, 'cause', err))}") from err
    pending = [i for i, (k, _) in enumerate(outcomes) if k == "pending"]
    failed = [e.cause for k, e in outcomes if k == "collective" and e is not None]
    if pending:
        operation = failed[0].operation if failed else what
        hung = ", ".join(rank(i) for i in pending)
        raise LearnerLost(f"{hung} did not finish {operation} within runtime.hang_timeout_s={hang_s or 0:g}",
                          ranks=[ranks[i] for i in pending], hung=True)
    if failed:  # every rank's collective failed and none is left running: no rank to blame
        raise RunError(f"{what}: {failed[0]}; the learner group cannot go on")
    return ray.get(refs)


def node_address(node_id: str | None) -> str | None:
    """A Ray node's address (its id's first 8 characters when Ray no longer lists it)."""
    import ray

    if not node_id:
        return None
    try:
        return next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), node_id[:8])
    except Exception:  # noqa: BLE001 - a sentence is still worth saying without the address
        return node_id[:8]
