"""A local Ray cluster in a session of its own. ray.init() would start Ray's processes (GCS, raylet, workers) as
children in this process's group, so a signal to the group (a scheduler's or timeout's SIGTERM) would kill the
learner before the stop's checkpoint. Instead a head process in a new session starts the cluster (with
ray.init, so Ray's defaults hold), marks its session directory with this driver (runtime.cluster.dead_runs), and takes
the cluster down on SIGTERM, or by itself within seconds once that driver is gone (killed with no chance to stop
it); this process joins it and owns it: ``stop_local`` takes it down, every wait bounded.

A run whose engines are kept warm (runtime.cluster.kept_engines) leaves instead (``keep_local``): the head holds the cluster until
the time its marker names, then takes it down itself; a later run with the same cluster key takes it over
(``start_local(key=...)``)."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rlgen.durable import exclusive_lock
from rlgen.runtime.cluster.dead_runs import (
    clear_for_local_cluster,
    cluster_processes,
    identity,
    kept_sessions,
    read_marker,
    remove_marker,
    same_process,
    session_members,
    stop_processes,
    write_marker,
)
from rlgen.runtime.cluster.kept_engines import CLAIM_MARGIN_S, NAMESPACE
from rlgen.runtime.cluster.kept_fingerprint import differs
from rlgen.runtime.errors import RunError, StopRequested
from rlgen.runtime.signals import StopFlag, at_hard_exit
from rlgen.types import JSONDict

log = logging.getLogger(__name__)

HEAD_STOP_S = 20.0  # for the head to take its cluster down before what is left is killed
# Ray starts one idle worker per CPU for the head's own driver, which runs nothing: a run's actors need workers of
# their own (their runtime env names environment variables), so those would only take the host's cores while
# the run imports, builds its model folder and starts its engines. Set to 1 in the environment to have them back.
HEAD_ENV = {"RAY_prestart_worker_first_driver": "0"}
SHUTDOWN_S = 30.0  # for ray.shutdown() here; leaving a cluster that is already gone can stall
CLAIM_LOCK = "rlgen_claim.lock"
GCS_ANSWER_S = 3.0  # for a kept cluster's GCS to accept a connection: ray.init would retry a dead one for minutes
_HEAD_CODE = "import sys; from rlgen.runtime.cluster.local_ray import head_main; head_main(sys.argv[1:])"


@dataclass
class LocalCluster:
    """The local cluster this process started (or took over from a run that kept it warm): its head process and
    where the head said it is."""

    head: subprocess.Popen[bytes] | _Head  # a _Head for a head another process started
    scratch: str  # the head's output until it answers, and the file it answers in
    address: str = ""
    session_dir: str = ""
    forget: Callable[[], None] = lambda: None  # takes back the hard-exit hook
    key: str = ""  # the cluster key (runtime.cluster.kept_engines) when its engines may be kept warm at the end
    taken_over: bool = False  # a cluster an earlier run kept warm: its engines and placement groups are there
    head_ident: JSONDict | None = None  # leftovers.identity() of the head: its session is the cluster's
    fingerprint: JSONDict | None = None  # runtime.cluster.kept_fingerprint: what started it, kept with it


class _Head:
    """A head process this process did not start (it took the cluster over), with the calls stop_local makes."""

    def __init__(self, ident: JSONDict):
        self.ident, self.pid = ident, int(ident["pid"])

    def poll(self) -> int | None:
        return None if same_process(self.ident) else 0

    def terminate(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.05)
        return 0


_local: LocalCluster | None = None
_atexit_armed = False


def head_main(argv: list[str]) -> None:
    """The head process: start Ray with the ray.init kwargs in argv[0], mark the session with the driver's
    identity (argv[2]), move its output into the session's logs, write the address and session directory to the
    file argv[1], then hold the cluster until SIGTERM or SIGINT and take it down."""
    import threading

    import ray

    init, answer, driver = json.loads(argv[0]), Path(argv[1]), json.loads(argv[2])
    done = threading.Event()
    ray.init(address="local", include_dashboard=False, log_to_driver=False, **init)
    session_dir = ray._private.worker._global_node.get_session_dir_path()  # noqa: SLF001 - no public accessor
    write_marker(session_dir, driver, head_pid=os.getpid())
    sys.stdout.flush()
    sys.stderr.flush()
    logs = Path(session_dir) / "logs"  # from here on the head's output is kept with the session's logs
    logs.mkdir(parents=True, exist_ok=True)
    fd = os.open(logs / "rlgen_head.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, which takes SIGTERM for itself
        signal.signal(sig, lambda *_: done.set())
    tmp = answer.with_name(answer.name + ".tmp")
    tmp.write_text(json.dumps({"address": ray.get_runtime_context().gcs_address, "session_dir": session_dir}))
    os.replace(tmp, answer)
    why = None
    while not done.wait(1.0) and (why := _no_longer_needed(session_dir)) is None:
        pass
    if why:
        print(f"taking the cluster down: {why}", flush=True)
    ray.shutdown()
    _stop_session(session_dir)


def _no_longer_needed(session_dir: str) -> str | None:
    """Why the head should take its cluster down now (None: it is still needed): the time a run kept it warm for
    has passed, or the driver its marker names is gone (killed, say, with no chance to stop it)."""

    marker = read_marker(session_dir)
    if marker is None:
        return None  # being rewritten, or removed by whoever stops this head
    kept = marker.get("kept")
    if isinstance(kept, dict):
        return "the time it was kept warm for has passed" if time.time() >= float(kept.get("until", 0)) else None
    driver = marker.get("driver")
    if isinstance(driver, dict) and driver.get("pid") is not None and not same_process(driver):
        return f"its driver (pid {driver['pid']}) is gone"
    return None


def _stop_session(session_dir: str) -> None:
    """The head, on its way out: stop what is left in its session (the kept engines' own processes) and remove
    the marker, so nothing of the cluster outlives it."""

    left = session_members(os.getpid())
    if left:
        stop_processes(left)
    remove_marker(session_dir)


def start_local(init: dict[str, int], timeout_s: float, stop: StopFlag | None, key: str = "",
                fingerprint: JSONDict | None = None) -> None:
    """Start a local cluster in a session of its own and join it (see above). With key (runtime.cluster.kept_engines's cluster
    key) and fingerprint (runtime.cluster.kept_fingerprint: this run's), a cluster an earlier run kept warm under
    that key and fingerprint is taken over instead. Every other kept cluster is stopped first: its engines hold
    memory this run needs."""
    global _local
    import ray

    stop_local()  # one started before and never released
    _token_auth_as_ray_init()
    if key and _take_over(key, fingerprint or {}):
        return
    clear_for_local_cluster()
    scratch = tempfile.mkdtemp(prefix="rlgen-ray-")
    answer = Path(scratch) / "head.json"
    with open(Path(scratch) / "head.log", "wb") as out:
        head = subprocess.Popen([sys.executable, "-c", _HEAD_CODE, json.dumps(init), str(answer), json.dumps(identity())],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**HEAD_ENV, **os.environ})
    cluster = _local = LocalCluster(head, scratch, key=key, head_ident=identity(head.pid), fingerprint=fingerprint)
    _own(cluster)
    try:
        info = _await_head(cluster, answer, timeout_s, stop)
        cluster.address, cluster.session_dir = info["address"], info["session_dir"]
        shutil.rmtree(scratch, ignore_errors=True)  # the head writes into the session's logs now
        with _quiet_connect():
            ray.init(address=cluster.address, log_to_driver=True, **_namespace(cluster))
    except BaseException as err:
        stop_local()
        if isinstance(err, (ConnectionError, RuntimeError)) and not isinstance(err, RunError):
            raise RunError(f"could not join the local Ray cluster this run started ({err}).") from err
        raise
    log.info("started a local Ray cluster in a session of its own: %s (head pid %d)", cluster.session_dir, head.pid)


def _own(cluster: LocalCluster) -> None:
    """This process takes the cluster down if it ends without release(), or on a second signal."""
    global _atexit_armed
    cluster.forget = at_hard_exit(lambda: _kill_now(cluster))
    if not _atexit_armed:
        atexit.register(stop_local)
        _atexit_armed = True


def _take_over(key: str, fingerprint: JSONDict) -> bool:
    """Join the cluster an earlier run kept warm under key, if there is one with time left that would start
    workers as this run would (its fingerprint: runtime.cluster.kept_fingerprint), and own it (its marker names
    this driver, without ``kept``, so neither its head nor another run ends it meanwhile). False when there is
    none, it differs (one line says how) or it cannot be joined; then it is stopped with the other leftovers."""
    global _local
    import ray

    for session, data in kept_sessions():
        kept = data["kept"]
        if kept.get("key") != key or float(kept["until"]) < time.time() + CLAIM_MARGIN_S:
            continue
        why = differs(kept.get("fingerprint"), fingerprint, head_pid=(data.get("head") or {}).get("pid"))
        if not why and not gcs_answers(str(kept.get("address", ""))):  # its Ray processes were stopped under it
            why = f"the kept Ray cluster's GCS at {kept.get('address')} does not answer"
        if why:
            log.warning("%s; starting a new one", why)
            continue
        with exclusive_lock(session / CLAIM_LOCK):  # one run at a time takes a kept cluster over
            data = read_marker(session) or {}
            if (data.get("kept") or {}).get("key") != key:
                continue  # another run took it meanwhile
            write_marker(session, identity(), head_pid=data["head"]["pid"])
        cluster = _local = LocalCluster(_Head(data["head"]), tempfile.mkdtemp(prefix="rlgen-ray-"), kept["address"],
                                        str(session), key=key, taken_over=True, head_ident=data["head"],
                                        fingerprint=kept.get("fingerprint"))
        _own(cluster)
        try:
            with _quiet_connect():
                ray.init(address=cluster.address, log_to_driver=True, **_namespace(cluster))
        except Exception as err:  # noqa: BLE001 - a cluster that cannot be joined is stopped and a new one started
            log.warning("could not join the Ray cluster an earlier run kept warm (%s); starting a new one", err)
            stop_local()
            return False
        log.info("took over the Ray cluster an earlier run kept warm: %s", session)
        return True
    return False


def gcs_answers(address: str, timeout_s: float = GCS_ANSWER_S) -> bool:
    """Whether a GCS at host:port accepts a connection within timeout_s."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def _namespace(cluster: LocalCluster) -> dict[str, str]:
    """Where a cluster whose engines may be kept warm names them and its placement groups, for the next driver."""
    return {"namespace": NAMESPACE} if cluster.key else {}


def keep_local(until: float) -> bool:
    """Leave the local cluster running for a later run to take over (runtime.cluster.kept_engines): mark it kept until that time
    (its head then takes it down), disconnect, and stop owning it. False (nothing changed) where this process
    owns no local cluster with a key."""
    global _local

    cluster = _local
    if cluster is None or not cluster.key or not cluster.session_dir or cluster.head.poll() is not None:
        return False
    data = read_marker(cluster.session_dir) or {}
    head = data.get("head") or {"pid": cluster.head.pid}
    # no driver: the next run that starts a local cluster stops it unless it takes it over
    write_marker(cluster.session_dir, {}, head_pid=head["pid"],
                 kept={"until": float(until), "key": cluster.key, "address": cluster.address,
                       "fingerprint": cluster.fingerprint})
    _local = None
    cluster.forget()
    bounded(ray_shutdown, SHUTDOWN_S, "ray.shutdown()")
    shutil.rmtree(cluster.scratch, ignore_errors=True)
    return True


def _await_head(cluster: LocalCluster, answer: Path, timeout_s: float, stop: StopFlag | None) -> dict[str, str]:
    """The head's answer (address, session_dir), within timeout_s."""

    deadline = time.monotonic() + timeout_s
    while True:
        if answer.is_file():
            return json.loads(answer.read_text())
        code = cluster.head.poll()
        if code is not None:
            output = _head_output(cluster)
            log.info("the local Ray cluster's head exited with %s:\n%s", code, output)
            last = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "no output")
            raise RunError(f"the local Ray cluster did not start (its head exited with {code}: {last.strip()}).")
        if stop is not None and stop.requested:
            raise StopRequested("starting Ray")
        if time.monotonic() >= deadline:
            raise RunError(f"the local Ray cluster did not start within startup_timeout_s={timeout_s:.0f} s; raise "
                           "startup_timeout_s=<seconds> if this machine is slow to start it.")
        time.sleep(0.1)


def _head_output(cluster: LocalCluster, limit: int = 20000) -> str:
    try:
        return (Path(cluster.scratch) / "head.log").read_bytes()[-limit:].decode(errors="replace")
    except OSError:
        return ""


def _token_auth_as_ray_init() -> None:
    """Token authentication as ray.init() sets it up for a cluster it starts (on, unless RAY_AUTH_MODE says
    otherwise, with the token saved where Ray looks), so the head, which inherits this environment, and this
    process agree. With RAY_AUTH_MODE unset the mode is set to token here, as ray.init() would, but without the
    warning ray.init() prints each time it does so (docs/cluster.md)."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            enable_token_auth_by_default,
            ensure_token_if_auth_enabled,
        )
        from ray._raylet import Config
    except ImportError:  # a Ray without token authentication
        return
    if "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = "token"  # for this process and the head, which inherits it
        Config.initialize("")  # Ray's cached config reads the mode again
    enable_token_auth_by_default()  # a mode set explicitly: taken as it is, without a warning
    ensure_token_if_auth_enabled({}, create_token_if_missing=True)


class _ConnectLines(logging.Filter):
    """Ray's "Connecting to existing Ray cluster" lines, which would misdescribe a cluster this run started."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Connecting to existing Ray cluster", "Connected to Ray cluster"))


@contextlib.contextmanager
def _quiet_connect() -> Iterator[None]:
    logger, quiet = logging.getLogger("ray._private.worker"), _ConnectLines()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _kill_now(cluster: LocalCluster) -> None:
    """SIGKILL to every process of the cluster's session, at once (a second signal is ending this process)."""

    with contextlib.suppress(OSError):
        os.killpg(cluster.head.pid, signal.SIGKILL)
    for pid in session_members(cluster.head.pid):  # workers move to process groups of their own
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if cluster.session_dir:
        remove_marker(cluster.session_dir)
    shutil.rmtree(cluster.scratch, ignore_errors=True)


def stop_local() -> None:
    """Leave and take down the local cluster this process started, whatever state it is in; every wait is
    bounded: the head gets HEAD_STOP_S to stop the cluster, then what is left of it is killed."""
    global _local

    cluster, _local = _local, None
    if cluster is None:
        return
    bounded(ray_shutdown, SHUTDOWN_S, "ray.shutdown()")
    cluster.forget()
    head = cluster.head
    if head.poll() is None:
        with contextlib.suppress(OSError):
            head.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(HEAD_STOP_S)
    # The head's pid names its session while any member lives, so this finds only the cluster's processes.
    left = cluster_processes(cluster.head_ident or {"pid": head.pid})
    stubborn = stop_processes(left) if left else []
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(1.0)
    if stubborn:
        log.warning("%d process(es) of the local Ray cluster would not stop (pids %s)", len(stubborn), stubborn)
    elif cluster.session_dir:
        remove_marker(cluster.session_dir)
    shutil.rmtree(cluster.scratch, ignore_errors=True)


def ray_shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def bounded(fn: Callable[[], None], timeout_s: float, what: str) -> None:
    """fn() in a thread, waited for at most timeout_s; its errors are logged (this runs on the way out)."""
    def run() -> None:
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - best effort on the way out
            log.info("%s failed: %s", what, err)

    thread = threading.Thread(target=run, name=f"rlgen {what}", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no new threads at interpreter exit (atexit): wait as long as it takes
        run()
        return
    thread.join(timeout_s)
    if thread.is_alive():
        log.warning("%s did not return within %.0f s; going on without it", what, timeout_s)


def local_cluster() -> LocalCluster | None:
    """The local cluster this process started and still owns, if any."""
    return _local
