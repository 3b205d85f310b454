"""A checkpoint being completed in the background (checkpoint.background=true): the Run holds one while its
learner files are written, and ``rlgen.runtime.durability.checkpoint`` starts, finishes and reports it."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass
class BackgroundWrite:
    """A checkpoint whose learner files are being written; a thread completes it when they are."""

    step: int
    tmp: Path
    started: float
    thread: threading.Thread | None = None
    error: BaseException | None = None
    seconds: float = 0.0  # from the start of the checkpoint to its COMPLETE marker
    path: Path | None = None


__all__ = ["BackgroundWrite"]
