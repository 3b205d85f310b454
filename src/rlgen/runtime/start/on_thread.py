"""Work on a thread of its own while the caller goes on (set-up prepares the model folder while Ray starts on the
main thread, which Ray's signal handlers need)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rlgen.runtime.errors import StopRequested
from rlgen.runtime.signals import StopFlag


class Beside:
    """fn(*args) on a daemon thread, then ``done()`` (say, ending its start-up phase); result() waits for it, leaving
    early on a stop, and raises what it raised."""

    def __init__(self, fn: Callable[..., Any], *args: Any, done: Callable[[], None] | None = None):
        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(done, fn, *args), name="rlgen-setup", daemon=True)
        self._thread.start()

    def _run(self, done: Callable[[], None] | None, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._box["out"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - raised again in the waiting thread
            self._box["err"] = err
        finally:
            if done is not None:
                done()

    def result(self, stop: StopFlag, what: str = "preparing the model folder and task") -> Any:
        while self._thread.is_alive():
            if stop.requested:
                raise StopRequested(what)
            self._thread.join(0.1)
        if "err" in self._box:
            raise self._box["err"]
        return self._box["out"]


__all__ = ["Beside"]
