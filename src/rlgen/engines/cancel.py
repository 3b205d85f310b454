"""A generation its caller no longer wants: engines ask ``requested()`` between decoding steps and stop early.

The caller asks in one of two ways. An engine in a Ray actor is cancelled with ``ray.cancel`` on the call's
ObjectRef; Ray cannot interrupt a running task of a threaded or plain actor, but marks it, and
``requested()`` reads that mark. An engine object in the caller's own process (the serve pool's in-process
engines) is cancelled through an Event that ``run()`` attaches to the thread making the call."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

_local = threading.local()


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


def _ray_cancelled() -> bool:
    ray = sys.modules.get("ray")  # never imported here: a process without Ray has no Ray task to cancel
    if ray is None or not ray.is_initialized():
        return False
    try:
        return bool(ray.get_runtime_context().is_canceled())
    except (RuntimeError, AttributeError):  # the driver, a thread that runs no task, an older Ray
        return False


__all__ = ["CallCancelled", "requested", "run"]
