"""Work on a thread of its own while the caller goes on (set-up prepares the model folder while Ray starts on the
main thread, which Ray's signal handlers need)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from rlgen.runtime.errors import StopRequested
from rlgen.runtime.signals import StopFlag

T = TypeVar("T")


class Beside(Generic[T]):
    """fn(*args) on a daemon thread, then ``done()`` (say, ending its start-up phase); result() waits for it, leaving
    early on a stop, and raises what it raised."""

    def __init__(self, fn: Callable[..., T], *args: object, done: Callable[[], None] | None = None):
        self._out: list[T] = []  # what fn returned, once it has
        self._err: list[BaseException] = []  # what it raised, if it did
        self._thread = threading.Thread(target=self._run, args=(done, fn, *args), name="rlgen-setup", daemon=True)
        self._thread.start()

    def _run(self, done: Callable[[], None] | None, fn: Callable[..., T], *args: object) -> None:
        try:
            self._out.append(fn(*args))
        except BaseException as err:  # noqa: BLE001 - raised again in the waiting thread
            self._err.append(err)
        finally:
            if done is not None:
                done()

    def finished(self) -> bool:
        """Whether fn has returned or raised (result() would not wait)."""
        return not self._thread.is_alive()

    def result(self, stop: StopFlag, what: str = "preparing the model folder and task") -> T:
        while self._thread.is_alive():
            if stop.requested:
                raise StopRequested(what)
            self._thread.join(0.1)
        if self._err:
            raise self._err[0]
        return self._out[0]


__all__ = ["Beside"]
