"""What a dead run's Ray cluster left behind, found and stopped.

A local cluster that rlgen starts gets a marker, ``<session dir>/rlgen_driver.json``, naming the driver that
asked for it (pid and start time) and the cluster's head process, which starts the cluster in a process session
of its own. The head takes its cluster down itself once its driver is gone (runtime.cluster.local_ray); when the head is
gone too, the next local cluster's start stops what is left: for every session under Ray's temp root whose
marker names a driver that is gone, the processes of the head's session (by pid and start time, never by what
their command line names) get SIGTERM, then SIGKILL, and the marker goes. Sessions without a marker (clusters
rlgen did not start) and sessions whose driver still runs are never touched. It reads /proc, so it works on
Linux and does nothing elsewhere."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlgen.types import JSONDict, JSONValue

log = logging.getLogger(__name__)

MARKER = "rlgen_driver.json"
PROC = Path("/proc")
TERM_WAIT_S = 5.0  # for processes to end after SIGTERM, before SIGKILL
KILL_WAIT_S = 2.0  # for them to end after SIGKILL


def supported() -> bool:
    return sys.platform.startswith("linux") and (PROC / "self" / "stat").is_file()


def ray_temp_root() -> Path:
    """Where Ray keeps its session directories, found as Ray finds it: $RAY_TMPDIR/ray, else $TMPDIR/ray (Linux),
    else /tmp/ray."""
    if "RAY_TMPDIR" in os.environ:
        base = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        base = os.environ["TMPDIR"]
    else:
        base = "/tmp"
    return Path(base) / "ray"


# -- processes, from /proc ------------------------------------------------------------------------------------
def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return text.rsplit(")", 1)[-1].split()


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks after boot); None when there is no such process or it has
    ended (a zombie)."""
    fields = _stat(pid)
    if not fields or fields[0] in ("Z", "X", "x"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    try:
        return (PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


def identity(pid: int | None = None) -> JSONDict:
    """What tells this process (or pid) apart from a later one that gets the same pid."""
    pid = os.getpid() if pid is None else int(pid)
    return {"pid": pid, "start": start_time(pid), "boot": boot_id()}


def same_process(ident: JSONValue) -> bool:
    """True while the process that ``ident`` (from identity()) describes still runs: its pid is alive with the
    same start time, since the same boot."""
    if not isinstance(ident, dict) or not isinstance(ident.get("pid"), int):
        return False
    boot = boot_id()
    if ident.get("boot") and boot and ident["boot"] != boot:
        return False
    start = start_time(ident["pid"])
    return start is not None and (ident.get("start") is None or start == ident["start"])


def _pids() -> list[int]:
    try:
        return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]
    except OSError:
        return []


def cluster_processes(head: JSONValue) -> list[int]:
    """The processes of the cluster whose head ``head`` (identity() of it) was: the head while it runs, and every
    live process of its session (the head starts one of its own) that started no earlier than it did. A session's
    id stays taken while any member lives, so the id cannot have passed to another session meanwhile, and a
    process outside the session (a ``tail -f`` of a log in the session folder) is never among them, whatever its
    command line names. Empty for a marker without a head."""
    if not isinstance(head, dict) or not isinstance(head.get("pid"), int):
        return []
    if head.get("boot") and boot_id() not in (None, head["boot"]):
        return []  # the machine started again since: its session ids are new
    since = head.get("start")
    members = [pid for pid in session_members(head["pid"])
               if since is None or (start_time(pid) or 0) >= since]
    if same_process(head) and head["pid"] not in members and head["pid"] != os.getpid():
        members.append(head["pid"])
    return members


def session_members(sid: int) -> list[int]:
    """Live processes of the session (setsid) whose leader was pid ``sid``; never this process."""
    if not supported():
        return []
    out = []
    for pid in _pids():
        fields = _stat(pid)
        if pid != os.getpid() and fields and fields[0] not in ("Z", "X", "x") and fields[3] == str(sid):
            out.append(pid)
    return out


def stop_processes(pids: Iterable[int], term_wait_s: float = TERM_WAIT_S, kill_wait_s: float = KILL_WAIT_S) -> list[int]:
    """SIGTERM, up to term_wait_s for them to end, then SIGKILL and up to kill_wait_s more. Each is signalled only
    while it is the process that was there when this was called (same start time). Returns those still alive."""
    live = {pid: start for pid in set(pids) if pid != os.getpid() and (start := start_time(pid)) is not None}
    for sig, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, kill_wait_s)):
        for pid, start in live.items():
            if start_time(pid) == start:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while True:
            live = {pid: start for pid, start in live.items() if start_time(pid) == start}
            if not live or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if not live:
            break
    return sorted(live)


# -- markers --------------------------------------------------------------------------------------------------
def write_marker(session_dir: str | Path, driver: JSONDict, head_pid: int | None = None,
                 kept: JSONDict | None = None) -> Path:
    """Mark the session as one whose cluster rlgen started for ``driver`` (identity() of the driver), with
    ``head_pid``, the process that holds the cluster, and ``kept`` while its engines are kept warm for the next
    run ({"until": time, "key": the cluster's key, "address": its GCS address}). Written whole or not at all."""
    path = Path(session_dir) / MARKER
    data = {"driver": driver, "head": identity(head_pid) if head_pid else None, "written": time.time()}
    if kept:
        data["kept"] = kept
    tmp = path.with_name(f".{MARKER}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)
    return path


def read_marker(session_dir: str | Path) -> JSONDict | None:
    try:
        data = json.loads((Path(session_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def remove_marker(session_dir: str | Path) -> None:
    with contextlib.suppress(OSError):
        (Path(session_dir) / MARKER).unlink()


def kept_for(data: JSONDict | None, now: float | None = None) -> JSONDict | None:
    """The marker's ``kept`` part while its cluster is kept warm: before its end, with its head running."""
    kept = (data or {}).get("kept")
    if not isinstance(kept, dict) or not isinstance(kept.get("until"), (int, float)):
        return None
    now = time.time() if now is None else now
    return kept if kept["until"] > now and same_process(data.get("head")) else None


def _sessions(root: str | Path | None) -> list[Path]:
    root = Path(root) if root is not None else ray_temp_root()
    try:
        markers = sorted(root.glob(f"session_*/{MARKER}"))
    except OSError:
        return []
    return [m.parent for m in markers if not m.parent.is_symlink()]  # session_latest: its session is listed too


def kept_sessions(root: str | Path | None = None) -> list[tuple[Path, JSONDict]]:
    """Session directories under root whose cluster is kept warm, with their markers."""
    out = []
    for session in _sessions(root):
        data = read_marker(session)
        if data is not None and kept_for(data) is not None:
            out.append((session, data))
    return out


def orphaned_sessions(root: str | Path | None = None, kept_too: bool = False) -> list[tuple[Path, JSONDict]]:
    """Session directories under root (Ray's temp root by default) with a marker whose driver is gone; a cluster
    kept warm for the next run only with kept_too."""
    out = []
    for session in _sessions(root):
        data = read_marker(session)
        if data is not None and not same_process(data.get("driver")) and (kept_too or kept_for(data) is None):
            out.append((session, data))
    return out


def clean_leftovers(root: str | Path | None = None, kept_too: bool = False) -> list[Path]:
    """Stop the processes that runs whose driver died left of their Ray clusters under root (Ray's temp root by
    default), with kept_too also the clusters kept warm for the next run, remove their markers, and log one line
    saying what was stopped. Returns the sessions cleaned."""
    if not supported():
        return []
    dead = orphaned_sessions(root, kept_too)
    if not dead:
        return []
    pids = {session: set(cluster_processes(data.get("head"))) for session, data in dead}
    every = set().union(*pids.values())
    stubborn = set(stop_processes(every)) if every else set()
    cleaned = []
    for session, mine in pids.items():
        if not mine & stubborn:
            remove_marker(session)
            cleaned.append(session)
    if every:
        names = ", ".join(s.name for s, mine in pids.items() if mine)
        left = f"; {len(stubborn)} would not stop (pids {sorted(stubborn)})" if stubborn else ""
        kept = sum(1 for _, data in dead if kept_for(data) is not None)
        why = "when its driver died" if not kept else f"({kept} cluster(s) kept warm for runs with other settings)"
        log.warning("stopped %d Ray process(es) that an earlier run left behind %s (%s)%s", len(every - stubborn), why,
                    names, left)
    return cleaned


def clear_for_local_cluster(root: str | Path | None = None) -> list[Path]:
    """Before a local Ray cluster starts: stop what dead drivers left and the clusters kept warm (their engines hold
    memory the new cluster needs). A failure is logged, never raised. Returns the sessions cleaned."""
    try:
        return clean_leftovers(root, kept_too=True)
    except Exception as err:  # noqa: BLE001 - tidying up after others must not stop what starts
        log.warning("could not check for Ray processes that earlier runs left behind or kept warm: %s", err)
        return []


def stop_kept_for_own_cluster(root: str | Path | None = None) -> list[Path]:
    """For a command that starts a local Ray cluster of its own (``rlgen bench``, ``rlgen validate``):
    clear_for_local_cluster, unless RAY_ADDRESS names a cluster to join. Returns the sessions cleaned."""
    return [] if os.environ.get("RAY_ADDRESS") else clear_for_local_cluster(root)


__all__ = [
    "MARKER",
    "clean_leftovers",
    "clear_for_local_cluster",
    "stop_kept_for_own_cluster",
    "identity",
    "kept_for",
    "kept_sessions",
    "orphaned_sessions",
    "ray_temp_root",
    "read_marker",
    "remove_marker",
    "same_process",
    "session_members",
    "cluster_processes",
    "start_time",
    "stop_processes",
    "write_marker",
]
