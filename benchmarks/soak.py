"""A soak of `rlgen train` on CPU under load, for hours, with faults at seeded random times; it passes when the
soak's per-step metrics end equal (to 1e-6) to those of an uninterrupted run of the same steps.

    python benchmarks/soak.py OUT [--hours 2] [--steps N] [--seed S] [--run-root DIR] [-- OVERRIDES ...]

Faults: an engine actor or the learner actor SIGKILLed, SIGTERM to the driver, the disk filled by a ballast
file. The reference runs after the soak by default; --side-by-side runs it beside (on a 2-core machine that
doubles the load and slows both): with --hours alone it runs open-ended and is stopped once it has passed the
soak's last step, and only the steps both have are compared. How to run it, the options and soak.json's fields:
docs/benchmarks.md ("Soak"). Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlgen.runtime.cluster.dead_runs import cluster_processes, read_marker, stop_processes
from rlgen.runtime.durability.checkpoint_folder import list_checkpoints
from rlgen.runtime.durability.disk_space import folder_bytes, needed_with_headroom
from rlgen.runtime.durability.status_file import read_status

KINDS = ("engine_kill", "driver_sigterm", "learner_kill", "disk_full")
DEFAULT_OVERRIDES = ["engine.num_engines=2", "hardware.learner_ranks=2", "algo.async_steps=1", "checkpoint.every=10",
                     "engine.max_restarts=1000"]
EXACT = ("reward_mean", "reward_std", "loss", "pg_loss", "grad_norm", "entropy", "mismatch/k3_kl")
EQUAL = ("version", "staleness", "sequences")
TOLERANCE = 1e-6
OPEN_ENDED_STEPS = 10_000_000  # --hours without --steps: the soak runs until its time is up, then ends cleanly
FINAL_STEPS = 5  # ... then trains this many steps more from that stop, so the end is a resumed run finishing
MAX_BALLAST = 8 * 2**30  # a run root with more free space than this is not the small file system asked for
EXPECTED = {"driver_sigterm": (143, "stopped at step"), "learner_kill": (1, " died during "),
            "disk_full": (1, " free but a checkpoint needs about ")}


# -- pure parts ----------------------------------------------------------------------------------------------
@dataclass
class Fault:
    at_s: float  # seconds after the soak began, as scheduled
    kind: str
    fired_s: float | None = None
    step: int | None = None  # steps logged when it fired
    outcome: str = "not reached"
    ok: bool | None = None
    detail: dict = field(default_factory=dict)


def fault_schedule(seed: int, span_s: float, kinds: list[str], mean_gap_s: float, warmup_s: float) -> list[Fault]:
    """Faults between warmup_s and 90% of span_s, one in each of n equal slots at a seeded random point of it
    (n: span over mean_gap_s, at least one per kind); kinds in rounds of a seeded shuffle, so each comes once
    before any comes twice."""
    rng = random.Random(seed)
    lo, hi = warmup_s, max(warmup_s + 1.0, 0.9 * span_s)
    n = max(len(kinds), round((hi - lo) / mean_gap_s))
    order: list[str] = []
    while len(order) < n:
        round_ = list(kinds)
        rng.shuffle(round_)
        order += round_
    slot = (hi - lo) / n
    return [Fault(round(lo + slot * (i + rng.uniform(0.1, 0.9)), 1), order[i]) for i in range(n)]


def compare(soak: list[dict], reference: list[dict], tol: float = TOLERANCE) -> dict:
    """Step by step: the same steps, each once, in order; the max abs difference of each EXACT metric (within
    tol) and the EQUAL fields equal; the first step where either is not so. NaN against NaN counts as equal."""
    steps_same = [r.get("step") for r in soak] == [r.get("step") for r in reference]
    diffs: dict[str, float] = {}
    unequal: list[str] = []
    first_off = None
    for s, r in zip(soak, reference):
        off = [k for k in EQUAL if k in r and s.get(k) != r[k]]
        for key in EXACT:
            if key not in r:
                continue
            a, b = float(s.get(key, math.nan)), float(r[key])
            d = 0.0 if math.isnan(a) and math.isnan(b) else abs(a - b)
            was = diffs.get(key, 0.0)
            diffs[key] = math.nan if math.isnan(d) or math.isnan(was) else max(was, d)
            off += [key] if not d <= tol else []
        unequal += [f"step {r.get('step')}: {k}" for k in EQUAL if k in off]
        first_off = r.get("step") if first_off is None and off else first_off
    within = all(not math.isnan(d) and d <= tol for d in diffs.values())
    return {"steps": len(reference), "steps_same": steps_same, "max_abs_diff": diffs, "first_step_off": first_off,
            "unequal": unequal[:20], "passed": bool(reference) and steps_same and within and not unequal}


def ballast_bytes(free: int, checkpoint_bytes: int, small_bytes: int) -> int:
    """What to fill so half of what the next checkpoint's free-space check asks for stays free (small_bytes: the
    run's small files, plan.json's disk.small_bytes)."""
    return max(0, free - needed_with_headroom(checkpoint_bytes, small_bytes) // 2)


# -- one `rlgen train` process -------------------------------------------------------------------------------
class MetricsTail:
    """metrics.jsonl read as it grows; a file replaced or cut (a resumed run keeps its first lines) is read again
    from the start, and those lines count as seen, not as new."""

    def __init__(self, path: Path):
        self.path, self.ino, self.offset, self.lines, self.new, self.last = path, None, 0, 0, 0, {}

    def poll(self) -> int:
        """Reads what was added; returns how many lines were new."""
        try:
            st = self.path.stat()
        except OSError:
            return 0
        fresh = st.st_ino != self.ino or st.st_size < self.offset
        if fresh:
            self.ino, self.offset, self.lines = st.st_ino, 0, 0
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(whole)
        rows = whole.splitlines()
        if rows:
            with contextlib.suppress(ValueError):
                self.last = json.loads(rows[-1])
        self.lines += len(rows)
        if not fresh:
            self.new += len(rows)
        return 0 if fresh else len(rows)


class Launch:
    """One `rlgen train` subprocess in a session of its own, its output in a log file."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str], tail: MetricsTail):
        self.cmd, self.log, self.tail, self.started = cmd, log, tail, time.time()
        self.new_at_start, self.progress_at = tail.new, time.time()
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def poll(self) -> int | None:
        if self.tail.poll():
            self.progress_at = time.time()
        return self.proc.poll()

    @property
    def stepping(self) -> bool:  # it has logged a step of its own
        return self.tail.new > self.new_at_start

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self, run_dir: Path) -> None:
        """SIGTERM to its process group, SIGKILL after 60 s, then whatever is left of its Ray cluster."""
        for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait)
                break
        stop_processes(run_processes(run_dir))


def run_processes(run_dir: Path) -> list[int]:
    """The live processes of the Ray cluster the run's status.json names (its head's session), or none."""
    try:
        session = json.loads((run_dir / "status.json").read_text()).get("ray_session")
    except (OSError, ValueError):
        return []
    marker = read_marker(session) if session else None
    return cluster_processes((marker or {}).get("head"))


def actor_pids(run_dir: Path, class_name: str) -> list[int]:
    """Ray worker processes of this run's cluster whose title is `ray::<class_name>` (idle or in a method)."""
    out = []
    for pid in run_processes(run_dir):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title == f"ray::{class_name}" or title.startswith(f"ray::{class_name}."):
            out.append(pid)
    return sorted(out)


def fill_disk(root: Path, checkpoint_bytes: int, small_bytes: int) -> tuple[Path, int]:
    ballast = root / "soak-ballast"
    size = ballast_bytes(shutil.disk_usage(root).free, checkpoint_bytes, small_bytes)
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return ballast, size


# -- the soak --------------------------------------------------------------------------------------------------
class Soak:
    def __init__(self, args: argparse.Namespace, overrides: list[str]):
        self.args, self.out = args, Path(args.out)
        root = Path(args.run_root) if args.run_root else self.out
        self.run_dir = root / f"soak-{time.strftime('%Y%m%d-%H%M%S')}" if args.run_root else self.out / "soak"
        self.ref_dir = self.out / "reference"
        self.ray_tmp = tempfile.mkdtemp(prefix="sk", dir="/tmp")  # Ray's socket paths must stay short
        self.env = {**os.environ, "RAY_TMPDIR": self.ray_tmp}
        self.base = [sys.executable, "-m", "rlgen.cli", "train", "progress=false", *overrides]
        self.steps = args.steps or OPEN_ENDED_STEPS
        self.faults = fault_schedule(args.seed, args.hours * 3600, args.faults, args.mean_gap, args.warmup)
        self.launches: list[dict] = []
        self.failures: list[str] = []
        self.ballast: Path | None = None
        self.live: list[Launch] = []  # every launch, to end those still running when the soak is interrupted
        self.t0 = time.time()

    def elapsed(self) -> float:
        return time.time() - self.t0

    def launch(self, run_dir: Path, tail: MetricsTail, steps: int, resume: bool, name: str) -> Launch:
        cmd = [*self.base, f"steps={steps}", f"hydra.run.dir={run_dir}", *([f"resume={run_dir}"] if resume else [])]
        logs = self.out / "launches"
        logs.mkdir(parents=True, exist_ok=True)
        launch = Launch(cmd, logs / f"{len(self.launches):03d}-{name}.log", self.env, tail)
        self.live.append(launch)
        self.launches.append({"name": name, "at_s": round(self.elapsed(), 1), "steps": steps, "resume": resume,
                              "from_step": tail.lines if resume else 0, "log": launch.log.name})
        print(f"[{self.elapsed():7.0f} s] launch {name} steps={steps} resume={resume}", flush=True)
        return launch

    def fire(self, fault: Fault, launch: Launch) -> dict | None:
        """Injects the fault; returns what to wait for, or None when it could not be injected (recorded)."""
        fault.fired_s, fault.step = round(self.elapsed(), 1), launch.tail.lines
        print(f"[{fault.fired_s:7.0f} s] fault {fault.kind} at step {fault.step}", flush=True)
        if fault.kind in ("engine_kill", "learner_kill"):
            pids = actor_pids(self.run_dir, "HFEngine" if fault.kind == "engine_kill" else "TorchLearner")
            if not pids:
                self.fault = fault
                self.resolve("no such actor process found in the run's Ray cluster", False)
                return None
            pid = random.Random(self.args.seed + fault.step).choice(pids)
            os.kill(pid, signal.SIGKILL)
            fault.detail["pid"] = pid
            if fault.kind == "engine_kill":
                return {"restarts": launch.tail.last.get("engine_restarts", 0), "by": time.time() + self.args.wait_s}
        elif fault.kind == "driver_sigterm":
            os.kill(launch.proc.pid, signal.SIGTERM)
        elif fault.kind == "disk_full":
            ckpts = list_checkpoints(self.run_dir)
            small = json.loads((self.run_dir / "plan.json").read_text())["disk"]["small_bytes"]
            self.ballast, size = fill_disk(Path(self.args.run_root), folder_bytes(ckpts[-1]) if ckpts else 0, small)
            fault.detail.update(ballast_bytes=size, free_after=shutil.disk_usage(self.args.run_root).free)
        return {"exit": EXPECTED[fault.kind], "by": time.time() + self.args.wait_s}

    def run_soak(self, reference: Launch | None) -> bool:
        """The soak run to its end; faults fired as scheduled. False when it could not be finished."""
        self.tail, self.pending = MetricsTail(self.run_dir / "metrics.jsonl"), list(self.faults)
        self.current = self.launch(self.run_dir, self.tail, self.steps, False, "soak")
        self.fault, self.waiting, self.ending = None, None, False
        while True:
            rc = self.current.poll()
            if reference is not None:
                reference.poll()  # keeps its progress time for the stall bound
            if rc is not None:
                go_on = self.exited(rc)
                if rc == 0 or not go_on:
                    return rc == 0
                self.current = self.launch(self.run_dir, self.tail, self.steps, True, "soak")
                continue
            why = self.overdue()
            if why:
                self.failures.append(f"launch {len(self.launches) - 1}: {why}; killed")
                if self.fault is not None:
                    self.resolve(why, False)
                self.current.kill(self.run_dir)
                return False
            self.next_fault()
            time.sleep(0.5)

    def resolve(self, outcome: str, ok: bool | None) -> None:
        fault = self.fault
        fault.outcome, fault.ok = outcome, ok
        print(f"[{self.elapsed():7.0f} s]   {fault.kind}: {'ok' if ok else 'NOT ok' if ok is False else '-'}: "
              f"{outcome}", flush=True)
        if ok is False:
            self.failures.append(f"{fault.kind} at {fault.fired_s} s: {outcome}")
        self.fault = self.waiting = None

    def exited(self, rc: int) -> bool:
        """The soak launch ended with rc: the fault it answered is judged, and the ballast goes. True when the
        soak is finished (rc 0) or should be resumed; False when it gives up."""
        text, status = self.current.text(), read_status(self.run_dir) or {}
        self.launches[-1].update(exit=rc, stopped_at=status.get("step"), checkpoint=status.get("checkpoint"))
        if self.fault is not None and rc == 0:
            self.resolve("the run finished before the fault took effect", None)
        elif self.fault is not None and "exit" in self.waiting:
            want_rc, want_text = self.waiting["exit"]
            line = next((ln.strip() for ln in reversed(text.splitlines()) if want_text in ln), "")
            self.fault.detail["resume_from"] = status.get("checkpoint")
            self.resolve(f"exit {rc}: {line[:300]}" if line else f"exit {rc} (expected {want_rc})",
                         rc == want_rc and bool(line))
        elif self.fault is not None:
            self.resolve(f"the run exited {rc} before the engine was re-created", False)
        elif self.ending and rc == 143:
            self.steps = int(status.get("step") or self.tail.lines) + FINAL_STEPS
        elif rc != 0:
            self.failures.append(f"launch {len(self.launches) - 1} exited {rc} unexpectedly: "
                                 f"{text.strip().splitlines()[-1:] or ''}")
        if self.ballast is not None:
            self.ballast.unlink(missing_ok=True)
            self.ballast = None
        if len(self.launches) > self.args.max_launches or len(self.failures) > 5:
            self.failures.append("too many launches or failures; the soak gave up")
            return False
        return True

    def overdue(self) -> str | None:
        """Why the soak launch must be killed (past the soak's bound, stalled, a fault without outcome), or None."""
        now = time.time()
        if now > self.t0 + self.args.hours * 3600 * 3 + 3600:
            return "the soak ran past its bound"
        if now - self.current.progress_at > self.args.stall_s:
            return f"no step for {self.args.stall_s:.0f} s"
        if self.waiting and now > self.waiting["by"]:
            return f"{self.fault.kind}: no outcome within {self.args.wait_s:.0f} s"
        return None

    def next_fault(self) -> None:
        """Judges an engine kill once engine_restarts rose; fires the next fault when it is due and the run is
        stepping; ends an open-ended soak once its time is up."""
        last = self.tail.last.get("engine_restarts", 0)
        if self.waiting and "restarts" in self.waiting and last > self.waiting["restarts"]:
            self.resolve(f"re-created (engine_restarts {self.waiting['restarts']} -> {last}), the run went on", True)
        if self.waiting is not None or not self.current.stepping or self.ending:
            return
        if self.pending and self.pending[0].at_s <= self.elapsed():
            self.fault = self.pending.pop(0)
            self.waiting = self.fire(self.fault, self.current)
            if self.waiting is None:
                self.fault = None
        elif not self.args.steps and self.elapsed() >= self.args.hours * 3600:
            self.ending = True  # time is up: a clean stop, then FINAL_STEPS more from it
            print(f"[{self.elapsed():7.0f} s] time is up at step {self.tail.lines}: stopping", flush=True)
            os.kill(self.current.proc.pid, signal.SIGTERM)

    def run_reference(self, steps: int) -> Launch:
        return self.launch(self.ref_dir, MetricsTail(self.ref_dir / "metrics.jsonl"), steps, False, "reference")

    def finish_reference(self, ref: Launch) -> bool:
        """Waits for the reference's end; an open-ended one (beside an --hours soak) is stopped once it has
        logged as many steps as the soak has."""
        bound = time.time() + self.args.hours * 3600 * 3 + 3600
        open_ended = ref.cmd.count(f"steps={OPEN_ENDED_STEPS}") > 0
        while ref.poll() is None:
            if open_ended and ref.tail.lines >= self.tail.lines:
                print(f"[{self.elapsed():7.0f} s] the reference has passed step {self.tail.lines}: stopping it",
                      flush=True)
                ref.kill(self.ref_dir)
                return True
            if time.time() > bound or time.time() - ref.progress_at > self.args.stall_s:
                self.failures.append("the reference run hung; killed")
                ref.kill(self.ref_dir)
                return False
            time.sleep(1.0)
        if ref.proc.returncode != 0:
            self.failures.append(f"the reference run ended with exit {ref.proc.returncode}")
        return ref.proc.returncode == 0


def read_jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("torch", "ray", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    try:
        here = Path(__file__).resolve().parent
        out["rlgen_commit"] = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                                             text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        out["rlgen_commit"] = None
    return out


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    mine, overrides = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--hours", type=float, default=2.0, help="how long the soak runs (faults are spread over it)")
    ap.add_argument("--steps", type=int, default=None, help="a fixed number of steps instead (then --hours only "
                    "spreads the faults; those not reached before the run ends are listed as not reached)")
    ap.add_argument("--seed", type=int, default=0, help="the fault schedule's seed (the run's own is seed=...)")
    ap.add_argument("--run-root", default=None, help="a small file system for the soak's run directory (disk_full)")
    ap.add_argument("--faults", default=",".join(KINDS), help=f"which, comma-separated, of {','.join(KINDS)}")
    ap.add_argument("--mean-gap", type=float, default=300.0, help="seconds between faults, on average")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds before the first fault")
    ap.add_argument("--side-by-side", action="store_true", help="run the reference beside the soak "
                    "(with --hours alone, open-ended, stopped once past the soak's last step)")
    ap.add_argument("--stall-s", type=float, default=900.0, help="a launch with no new step this long is killed")
    ap.add_argument("--wait-s", type=float, default=900.0, help="how long a fault's outcome may take")
    ap.add_argument("--max-launches", type=int, default=500)
    args = ap.parse_args(mine)
    args.faults = [k for k in args.faults.split(",") if k]
    return args, [*DEFAULT_OVERRIDES, *overrides]


def refusal(args: argparse.Namespace) -> str | None:
    """One sentence when the arguments cannot make a soak, else None."""
    unknown = [k for k in args.faults if k not in KINDS]
    if unknown:
        return f"unknown fault kind(s) {unknown}; choose from {','.join(KINDS)}."
    if "disk_full" in args.faults:
        if not args.run_root:
            return ("the disk_full fault needs --run-root DIR, a small file system of its own (as root: mkdir DIR && "
                    "mount -t tmpfs -o size=512m tmpfs DIR); or leave it out: --faults engine_kill,driver_sigterm,"
                    "learner_kill.")
        if not Path(args.run_root).is_dir():
            return f"--run-root {args.run_root} is not a folder; create it and mount a small tmpfs there."
        if shutil.disk_usage(args.run_root).free > MAX_BALLAST:
            return (f"--run-root {args.run_root} has {shutil.disk_usage(args.run_root).free / 2**30:.0f} GiB free, "
                    "too much to fill with a ballast file; mount a small tmpfs there (mount -t tmpfs -o size=512m "
                    f"tmpfs {args.run_root}).")
    return None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    args, overrides = parse(argv)
    problem = refusal(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM to the soak ends its runs as Ctrl-C does
    soak = Soak(args, overrides)
    soak.out.mkdir(parents=True, exist_ok=True)
    ref = soak.run_reference(soak.steps) if args.side_by_side else None
    finished = False
    try:
        finished = soak.run_soak(ref)
        soak_wall = soak.elapsed()
        if finished and ref is None:
            ref = soak.run_reference(soak.steps)
        ref_ok = bool(ref) and finished and soak.finish_reference(ref)
    except KeyboardInterrupt:
        soak.failures.append("interrupted (Ctrl-C or SIGTERM)")
        soak_wall, ref_ok = soak.elapsed(), False
    finally:
        for launch in soak.live:
            if launch.proc.poll() is None:
                launch.kill(soak.ref_dir if "reference" in launch.log.name else soak.run_dir)
        for run_dir in (soak.run_dir, soak.ref_dir):
            stop_processes(run_processes(run_dir))
        if soak.ballast is not None:
            soak.ballast.unlink(missing_ok=True)
        shutil.rmtree(soak.ray_tmp, ignore_errors=True)
    kept = soak.out / "soak_run"  # the run root may be a tmpfs that goes with the soak
    kept.mkdir(exist_ok=True)
    for name in ("metrics.jsonl", "resumes.jsonl", "status.json", "run.log"):
        with contextlib.suppress(OSError):
            shutil.copy2(soak.run_dir / name, kept / name)
    records = read_jsonl(soak.run_dir / "metrics.jsonl")
    reference = read_jsonl(soak.ref_dir / "metrics.jsonl")
    verdict = compare(records, reference[: len(records)]) if ref_ok else {"passed": False}
    faults = [asdict(f) for f in soak.faults]
    if finished and faults and all(f["fired_s"] is None for f in faults):
        soak.failures.append(f"no fault fired: the run ended before the first was due ({faults[0]['at_s']} s)")
    result = {
        "passed": finished and ref_ok and verdict["passed"] and not soak.failures
                  and all(f["ok"] is not False for f in faults),
        "wall_s": round(soak.elapsed(), 1), "soak_s": round(soak_wall, 1), "steps": len(records),
        "overrides": overrides, "seed": args.seed, "side_by_side": args.side_by_side,
        "run_dir": str(soak.run_dir), "reference_dir": str(soak.ref_dir),
        "faults": faults, "fault_counts": {k: sum(f["kind"] == k and f["ok"] is True for f in faults) for k in KINDS},
        "engine_restarts": sum(f["kind"] == "engine_kill" and f["ok"] is True for f in faults),
        "relaunches": sum(entry["resume"] for entry in soak.launches if entry["name"] == "soak"),
        "launches": soak.launches, "comparison": verdict, "failures": soak.failures,
        "versions": versions(), "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    (soak.out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("passed", "wall_s", "steps", "fault_counts", "relaunches",
                                               "comparison", "failures")}, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
