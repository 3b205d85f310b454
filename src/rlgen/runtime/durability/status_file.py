"""``status.json`` in the run directory: what the run is doing or why it stopped, the last finished step,
the newest checkpoint and how to resume. Rewritten atomically on every change."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlgen.durable import rewrite_small

if TYPE_CHECKING:
    from rlgen.types import JSONDict, JSONValue

STATUS_FILE = "status.json"
# running: steps are going; finished: all steps done; stopped: a clean stop (signal or fault), resumable;
# failed: an error ended it; rejected: the plan refused the config
STATES = ("starting", "running", "finished", "stopped", "failed", "rejected")


def write_json_atomic(path: Path, data: JSONDict) -> None:
    """``data`` as JSON in ``path``, whole or not at all (rlgen.durable.replace_text); on a full disk overwritten
    in place (rlgen.durable.rewrite_small), so status.json can still say why a run ended."""
    rewrite_small(Path(path), json.dumps(data, indent=2, default=str) + "\n")


def read_status(run_dir: str | Path) -> JSONDict | None:
    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class RunStatus:
    def __init__(self, run_dir: str | Path, **fields: JSONValue):
        self.path = Path(run_dir) / STATUS_FILE
        self.data: JSONDict = {"state": "starting", "started": time.time(), "pid": os.getpid(), **fields}
        # A checkpoint completed in the background updates it too. Reentrant: a signal handler (the stop's first
        # signal) may update it on the thread that is in the middle of an update; its fields are then written by
        # that update, right after its own write, instead of deadlocking on the lock or clobbering the write.
        self._lock = threading.RLock()
        self._depth = 0
        self._pending: JSONDict = {}

    def update(self, **fields: JSONValue) -> None:
        if "state" in fields and fields["state"] not in STATES:
            raise ValueError(f"unknown run state {fields['state']!r}")
        with self._lock:
            if self._depth:
                self._pending.update(fields, updated=time.time())
                return
            self._depth += 1
            try:
                self.data.update(fields, updated=time.time())
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(self.path, self.data)
                while self._pending:
                    pending, self._pending = self._pending, {}
                    self.data.update(pending)
                    write_json_atomic(self.path, self.data)
            finally:
                self._depth -= 1

    def update_before_exit(self, **fields: JSONValue) -> None:
        """update() for a process that ends right after (a second signal's os._exit): the fields are written now.
        update() would leave them pending when the signal came in the middle of another update on this thread,
        whose write then never comes. Another thread's update under way gets a second to finish first."""
        held = self._lock.acquire(timeout=1.0)
        try:
            self.data.update(fields, updated=time.time())
            write_json_atomic(self.path, self.data)
        finally:
            if held:
                self._lock.release()
