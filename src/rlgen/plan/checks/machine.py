"""Checks of the machine against the plan, before anything starts: the Ray cluster named by ray.address answers
and takes this machine's token (plan.checks.ray_token), GPUs (on a local cluster), the packages the run imports
(vllm, deepspeed, wandb), and a CPU-only torch under a GPU plan. Each problem is one sentence.

``rlgen train`` refuses to start on such a problem; ``rlgen plan`` shows it as a note about this machine,
since a plan is often made on one machine for another."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

from rlgen.config import RunConfig, WandbMode
from rlgen.learners.registry import LEARNERS
from rlgen.tasks.rewards import NEEDS


def cluster_address(cfg: RunConfig) -> str | None:
    """The Ray cluster the run joins: ray.address, else RAY_ADDRESS; None: a fresh local one on this machine."""
    return cfg.ray.address or os.environ.get("RAY_ADDRESS") or None


def bootstrap_address(address: str) -> str | None:
    """host:port a Ray address points at: "auto" reads the file `ray start` leaves in Ray's temp dir."""
    if address == "auto":
        path = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        try:
            return path.read_text().strip() or None
        except OSError:
            return None
    return address.removeprefix("ray://")


def reachable(hostport: str, timeout_s: float = 3.0) -> bool:
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def cluster_join_mode(target: str, address: str) -> str | None:
    """This process in the authentication mode of the cluster at target (plan.checks.ray_token), or the sentence
    saying why it cannot join; None also where this Ray has no token authentication."""
    try:
        from rlgen.plan.checks.ray_token import join_mode

        return join_mode(target, address)
    except ImportError:  # a Ray without token authentication
        return None


def check_cluster(cfg: RunConfig, problems: list[str]) -> None:
    """A cluster named by ray.address (or RAY_ADDRESS) answers, and takes this machine's token where it wants
    one, before anything starts."""
    address = cluster_address(cfg)
    if not address:
        return
    target = bootstrap_address(address)
    if target is None:
        problems.append(f"ray.address={address} finds no Ray cluster started on this machine; start one with "
                        "ray start --head (and ray start --address=<head>:6379 on the other nodes), or give its "
                        "address as ray.address=<host>:<port>.")
    elif not reachable(target):
        problems.append(f"the Ray cluster at {target} (ray.address={address}) does not answer; check that it is "
                        "running (ray status) and reachable from here.")
    elif not address.startswith("ray://"):  # Ray Client: its server speaks for the cluster, and Ray handles it
        problem = cluster_join_mode(target, address)
        if problem:
            problems.append(problem)


def local_gpus() -> int:
    """NVIDIA GPUs this machine has, from the driver (no CUDA initialised): /proc, then nvidia-smi."""
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return sum(1 for _ in proc.iterdir())
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
            return sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            return 0
    return 0


def has_package(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def engine_package_problem(plan, other: str, problems: list[str]) -> None:
    """The package the plan's engine kind imports (vllm) is installed; `other` is the alternative to suggest."""
    package = plan.engine.package
    if package and not has_package(package):
        problems.append(f"engine={plan.engine_kind} needs the {package} package, which is not installed; pip install "
                        f"'rlgen[gpu]' on a CUDA machine, or {other}.")


def check_cards(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    """The preset's card against this machine's GPUs: fewer GB than it assumes is a problem, another card a note."""
    from rlgen.config.compose import group_options
    from rlgen.plan.checks.cards import mismatch, visible_gpus

    refusal, warning = mismatch(cfg.hardware, visible_gpus(), group_options("hardware"))
    problems += [refusal] if refusal else []
    notes += [warning] if warning else []


def check_environment(cfg: RunConfig, plan, problems: list[str], notes: list[str] | None = None) -> None:
    """What this machine lacks for the plan, into problems; what it would run differently (notes: another GPU
    card than the preset's)."""
    hw = cfg.hardware
    check_cluster(cfg, problems)
    if plan.nodes > 1 and not cluster_address(cfg):
        problems.append(
            f"hardware={hw.name} spans {plan.nodes} nodes; run it on a Ray cluster (ray start --head on one node, "
            "ray start --address=<head>:6379 on the others) and set ray.address=auto."
        )
    if plan.device == "cuda":
        if not cluster_address(cfg) and plan.nodes == 1:  # a local cluster: this machine must hold the plan
            have = local_gpus()
            need = max((g for e in plan.engines for g in e.gpus), default=-1)
            need = max([need] + [lr.gpu for lr in plan.learners if lr.gpu is not None]) + 1
            if have == 0:
                problems.append(
                    f"hardware={hw.name} needs {need} GPU(s), but this machine has none (no NVIDIA driver found); "
                    "use hardware=cpu engine=hf here, or run on a GPU machine or a Ray cluster (ray.address=...)."
                )
            elif have < need:
                problems.append(
                    f"hardware={hw.name} uses {need} GPUs, but this machine has {have}; pick hardware that fits "
                    f"(e.g. hardware=1xh100 for one GPU, or hardware=auto) or set hardware.gpus_per_node={have} "
                    "with matching engine_gpus and learner_gpus."
                )
            else:
                check_cards(cfg, problems, [] if notes is None else notes)
        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = ""
        if "+cpu" in torch_version:
            problems.append(f"torch {torch_version} is a CPU build, so hardware={hw.name} cannot use its GPUs; "
                            "install a CUDA build of torch (pip install 'rlgen[gpu]' brings one).")
    engine_package_problem(plan, "use engine=hf", problems)
    learner = LEARNERS[plan.learner_kind]
    if learner.package and not has_package(learner.package):
        problems.append(f"the learner on GPUs is {learner.label}, which is not installed; pip install 'rlgen[gpu]', or "
                        "set learner.kind=torch.")
    if cfg.task.kind.value == "dataset" and not has_package("datasets"):
        problems.append("task=dataset reads files with Hugging Face datasets, which is not installed; pip install "
                        "'rlgen[data]'.")

    for name in (cfg.task.rewards or {cfg.task.reward: 1.0}):
        if name in NEEDS and not has_package(NEEDS[name]):
            problems.append(f"the {name} reward needs {NEEDS[name].replace('_', '-')}, which is not installed; pip "
                            "install 'rlgen[data]'.")
    if cfg.wandb.mode != WandbMode.disabled and not has_package("wandb"):
        problems.append(f"wandb.mode={cfg.wandb.mode.value} needs the wandb package, which is not installed; pip "
                        "install 'rlgen[wandb]', or set wandb.mode=disabled.")
