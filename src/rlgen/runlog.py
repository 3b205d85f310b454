"""The run's log file, ``<run dir>/run.log``: what the terminal showed, the warnings of every library, and
the full detail of errors (tracebacks), which the terminal does not show."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

LOG_FILE = "run.log"
log = logging.getLogger("rlgen.console")


def plain_text(*objects: Any, width: int = 110, **kwargs: Any) -> str:
    """What rich would print for objects, as plain text."""
    buf = io.StringIO()
    Console(file=buf, width=width, no_color=True, highlight=False, emoji=False, soft_wrap=kwargs.get("soft_wrap", False)) \
        .print(*objects, **{k: v for k, v in kwargs.items() if k in ("sep", "end", "justify", "overflow")})
    return buf.getvalue().rstrip("\n")


class MirroredConsole(Console):
    """A rich Console whose print() also goes, as plain text, to the run log (progress bars do not)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 - rich's name
        super().print(*objects, **kwargs)
        if log.isEnabledFor(logging.INFO) and objects:
            log.info("%s", plain_text(*objects, **kwargs))


class RunLogHandler(logging.FileHandler):
    """run.log's handler. A record it cannot write (a full disk) is dropped without a word: logging's own report
    (a traceback under "--- Logging error ---") would land on the terminal in the middle of the run's lines, and
    the run says in one sentence why it stops."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if not isinstance(sys.exc_info()[1], OSError):
            super().handleError(record)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            super().flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the file is closed even when its last flush fails
            super().close()


def attach_run_log(run_dir: str | Path) -> Callable[[], None]:
    """Append INFO and above from every logger (Python warnings included) to run_dir/run.log until the
    returned function is called."""
    path = Path(run_dir) / LOG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for h in root.handlers:  # already attached (e.g. run_training called twice on one directory)
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path.resolve():
            return lambda: None
    handler = RunLogHandler(path, mode="a", encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    old_level = root.level
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    logging.captureWarnings(True)

    def detach() -> None:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(old_level)

    return detach
