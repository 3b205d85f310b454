"""The one kind of error a command shows as it is: a problem the user can fix, said in one sentence with the fix
(several problems: one line each). Every command prints it without a traceback and exits with ``exit_code``;
anything else is unexpected, and its traceback goes to a file."""

from __future__ import annotations

from collections.abc import Iterator


class UserError(Exception):
    """What the user asked for cannot be done as asked (2), or a run stopped for a reason it can say (1)."""

    exit_code = 2

    def sentences(self) -> list[str]:
        """One line per problem, as the command prints them."""
        return [line for line in str(self).splitlines() if line.strip()] or [type(self).__name__]


def causes(err: BaseException | None, depth: int = 8) -> Iterator[BaseException]:
    """err, then what caused it, a few levels deep: a Ray task error's original exception (``.cause``) and
    chained exceptions (``raise ... from``, or raised while handling another)."""
    for _ in range(depth):
        if err is None:
            return
        yield err
        err = getattr(err, "cause", None) or err.__cause__ or err.__context__


class EngineDead(RuntimeError):
    """The engine inside a live actor can no longer work: vLLM's engine core process died, or a CUDA error left
    its GPU state unusable. The actor answers, but only a new actor helps: the run re-creates it in its place,
    gives it the current weights and sends its requests again (rlgen.runtime.rollouts.engine_restarts)."""


def engine_died(err: BaseException) -> bool:
    """Whether a failed call means an engine is gone: an actor that died, or an engine that raised EngineDead,
    also when it reached us through another actor's call (an IPC update goes through the learner)."""
    from ray.exceptions import RayActorError

    return any(isinstance(e, (RayActorError, EngineDead)) for e in causes(err))
