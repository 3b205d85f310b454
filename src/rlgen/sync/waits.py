"""How a weight update fails and how long anyone waits for one: the errors (``SyncError``, ``SyncTimeoutError``),
waits that always end (a thread with a timeout; Ray refs or futures with a deadline) and the check that every side
took the version asked for. The transports (driver), the sender (learner) and the engines' update calls use them."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

if TYPE_CHECKING:
    from ray import ObjectRef

# a call still running: a Ray object ref, or a future where tests stand in for Ray
Pending: TypeAlias = "ObjectRef | concurrent.futures.Future[Any]"
# what an actor reports of its part in an update: {"actor", "version", "spans", "parts", ...} (JSON-like values)
SyncReport: TypeAlias = "dict[str, Any]"
T = TypeVar("T")

SLACK_S = 30.0  # the driver waits this much longer than the actors it waits on


class SyncError(RuntimeError):
    """A weight update failed; the message says why and what to do."""


class SyncTimeoutError(SyncError):
    """A wait ran past its timeout; the side waited on may still be blocked (an NCCL call cannot be cancelled)."""


def run_with_timeout(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """fn() on a daemon thread, waited for at most timeout_s. On timeout the thread is left behind (a
    blocked NCCL call cannot be interrupted) and SyncTimeoutError says so."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name=f"rlgen-sync-{what[:20]}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise SyncTimeoutError(
            f"{what} did not finish within {timeout_s:.0f} s. The transfer cannot be cancelled, so this "
            "process is unusable for weight sync; restart the run (raise timeout_s if the model is large)."
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")


def get_all(
    refs: Sequence[Pending], timeout_s: float, what: str, names: Sequence[str] | None = None, *, fetch: bool = True
) -> list[Any]:
    """Results of Ray object refs (or concurrent futures), in order, waiting at most timeout_s in all
    (fetch=False: only wait, return []). The first call to fail raises at once, so one side of a transfer
    failing does not leave the driver waiting on the other; SyncTimeoutError names the calls still out."""
    refs = list(refs)
    names = list(names) if names is not None else [f"call {i}" for i in range(len(refs))]
    if not refs:
        return []
    if all(isinstance(r, concurrent.futures.Future) for r in refs):
        done, _ = concurrent.futures.wait(refs, timeout=timeout_s, return_when=concurrent.futures.FIRST_EXCEPTION)
        for r in done:
            if r.exception() is not None:
                raise r.exception()
        late = [n for n, r in zip(names, refs) if r not in done]
        if late:
            raise SyncTimeoutError(f"{what}: no answer within {timeout_s:.0f} s from {', '.join(late)}.")
        return [r.result() for r in refs] if fetch else []
    import ray

    deadline, remaining = time.time() + timeout_s, list(refs)
    while remaining:
        ready, remaining = ray.wait(remaining, num_returns=1, timeout=max(0.0, deadline - time.time()))
        if not ready:
            out = {r.hex() for r in remaining}
            late = [n for n, r in zip(names, refs) if r.hex() in out]
            raise SyncTimeoutError(f"{what}: no answer within {timeout_s:.0f} s from {', '.join(late)}.")
        if fetch:
            ray.get(ready)  # raises now if that call failed
    return ray.get(refs) if fetch else []


def check_versions(results: Sequence[SyncReport], version: int, what: str) -> None:
    """Refuse an update unless every report in results says it took ``version``."""
    wrong = [(r.get("actor", "?"), r.get("version")) for r in results if r.get("version") != version]
    if wrong:
        raise SyncError(f"{what}: expected policy version {version} everywhere, got {wrong}.")


__all__ = ["SLACK_S", "Pending", "SyncError", "SyncReport", "SyncTimeoutError", "check_versions", "get_all",
           "run_with_timeout"]
