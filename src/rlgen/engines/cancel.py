"""A generation its caller no longer wants: engines ask ``requested()`` between decoding steps and stop early.

The caller asks in one of two ways. An engine in a Ray actor is cancelled with ``ray.cancel`` on the call's
ObjectRef; Ray cannot interrupt a running task of a threaded or plain actor, but marks it, and
``requested()`` reads that mark. An engine object in the caller's own process (the serve pool's in-process
engines) is cancelled through an Event that ``run()`` attaches to the thread making the call."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_local = threading.local()
POLL_S = 0.25  # a stream waiting for its engine's next output checks this often whether its call was cancelled
CANCELLED = object()  # next_event's answer once the call is cancelled


class CallCancelled(RuntimeError):
    """Raised by an engine call that stopped because its caller cancelled it; nobody waits for its result."""


def run(event: threading.Event, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in this thread, cancelled once ``event`` is set (from any thread)."""
    _local.event = event
    try:
        return fn(*args)
    finally:
        _local.event = None


def requested(event: threading.Event | None = None) -> bool:
    """Whether this thread's call (or ``event``) has been cancelled."""
    own = getattr(_local, "event", None)
    if (event is not None and event.is_set()) or (own is not None and own.is_set()):
        return True
    return _ray_cancelled()


def next_event(events: queue.Queue, event: threading.Event | None = None, timeout_s: float | None = None) -> Any:
    """The next item a generating thread put on ``events``; CANCELLED when none came within a poll and the call (or
    ``event``) was cancelled, which a streamed call's consumer thread sees, not the generating one. Raises
    TimeoutError when nothing came for timeout_s."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            return events.get(timeout=POLL_S)
        except queue.Empty:
            if requested(event):
                return CANCELLED
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"nothing came for {timeout_s:.0f} s") from None


def _ray_cancelled() -> bool:
    ray = sys.modules.get("ray")  # never imported here: a process without Ray has no Ray task to cancel
    if ray is None or not ray.is_initialized():
        return False
    try:
        return bool(ray.get_runtime_context().is_canceled())
    except (RuntimeError, AttributeError):  # the driver, a thread that runs no task, an older Ray
        return False


__all__ = ["CANCELLED", "POLL_S", "CallCancelled", "next_event", "requested", "run"]
