"""Clean stops on SIGINT and SIGTERM: the first signal asks the run to stop at the next safe point (the
driver notices it in its waits), the second exits at once, after the hooks given to ``at_hard_exit``."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
_HARD_EXIT: list[Callable[[], None]] = []


def at_hard_exit(hook: Callable[[], None]) -> Callable[[], None]:
    """Run hook just before a second signal ends the process at once: for what would outlive it otherwise, such
    as a Ray cluster in a session of its own. Hooks must be quick; their errors are ignored. Returns a function
    that takes the hook back."""
    _HARD_EXIT.append(hook)

    def forget() -> None:
        with contextlib.suppress(ValueError):
            _HARD_EXIT.remove(hook)

    return forget


class StopFlag:
    """Set by a signal (``install``) or by a call (``request``). ``on_first`` runs when the first signal
    arrives (a progress line can say "stopping"); ``on_second`` runs just before a second signal exits the
    process with 128 + signal."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self.on_first: Callable[[], None] | None = None
        self.on_second: Callable[[int], None] | None = None
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
        self.armed = False

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGINT)

    @property
    def name(self) -> str:
        return NAMES.get(self.signum, f"signal {self.signum}")

    def request(self, signum: int = signal.SIGINT) -> None:
        if self.signum is None:
            self.signum = int(signum)
            log.info("stop requested (%s): stopping at the next safe point", self.name)
            if self.on_first is not None:
                self.on_first()

    def install(self) -> None:
        """Take SIGINT and SIGTERM (main thread only)."""
        self.armed = True
        for sig in SIGNALS:
            previous = signal.signal(sig, self._handle)
            if previous is not self._handle:
                self._previous.setdefault(sig, previous)

    def rearm(self) -> None:
        """Install again if installed before (ray.init replaces the SIGTERM handler); no-op otherwise."""

        if self.armed and threading.current_thread() is threading.main_thread():
            self.install()

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        self.armed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self.request(signum)
            return
        if self.on_second is not None:
            with contextlib.suppress(BaseException):
                self.on_second(signum)
        for hook in list(_HARD_EXIT):
            with contextlib.suppress(BaseException):
                hook()
        os._exit(128 + signum)
