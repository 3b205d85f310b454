"""Checks of the machine against the plan, before anything starts: GPUs (on a local cluster), the packages the
run imports (vllm, deepspeed, wandb), and a CPU-only torch under a GPU plan. Each problem is one sentence.

``rlgen train`` refuses to start on such a problem; ``rlgen plan`` shows it as a note about this machine,
since a plan is often made on one machine for another."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from rlgen.config import RunConfig, WandbMode


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


def uses_deepspeed(cfg: RunConfig, device: str) -> bool:
    kind = cfg.learner.kind.value
    return kind == "deepspeed" or (kind == "auto" and device == "cuda")


def check_environment(cfg: RunConfig, plan, problems: list[str]) -> None:
    hw = cfg.hardware
    if plan.device == "cuda":
        if not os.environ.get("RAY_ADDRESS"):  # a local cluster: this machine must hold the plan
            have = local_gpus()
            need = max((g for e in plan.engines for g in e.gpus), default=-1)
            need = max([need] + [lr.gpu for lr in plan.learners if lr.gpu is not None]) + 1
            if plan.nodes > 1:
                problems.append(
                    f"hardware={hw.name} spans {plan.nodes} nodes; run it on a Ray cluster (ray start --head here, "
                    "ray start --address=<head>:6379 on the others) and set RAY_ADDRESS=auto."
                )
            elif have == 0:
                problems.append(
                    f"hardware={hw.name} needs {need} GPU(s), but this machine has none (no NVIDIA driver found); "
                    "use hardware=cpu engine=hf here, or run on a GPU machine or a Ray cluster (RAY_ADDRESS)."
                )
            elif have < need:
                problems.append(
                    f"hardware={hw.name} uses {need} GPUs, but this machine has {have}; pick hardware that fits "
                    f"(e.g. hardware=1xh100 for one GPU) or set hardware.gpus_per_node={have} with matching "
                    "engine_gpus and learner_gpus."
                )
        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = ""
        if "+cpu" in torch_version:
            problems.append(f"torch {torch_version} is a CPU build, so hardware={hw.name} cannot use its GPUs; "
                            "install a CUDA build of torch (pip install 'rlgen[gpu]' brings one).")
    if plan.engine_kind == "vllm" and not has_package("vllm"):
        problems.append("engine=vllm needs the vllm package, which is not installed; pip install 'rlgen[gpu]' on a "
                        "CUDA machine, or use engine=hf.")
    if uses_deepspeed(cfg, plan.device) and not has_package("deepspeed"):
        problems.append("the learner on GPUs is DeepSpeed, which is not installed; pip install 'rlgen[gpu]', or set "
                        "learner.kind=torch.")
    if cfg.wandb.mode != WandbMode.disabled and not has_package("wandb"):
        problems.append(f"wandb.mode={cfg.wandb.mode.value} needs the wandb package, which is not installed; pip "
                        "install 'rlgen[wandb]', or set wandb.mode=disabled.")
