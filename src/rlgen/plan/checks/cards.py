"""This machine's GPUs as a run would get them, and what they mean for a plan: ``hardware=auto``'s layout, and
the sentence for a hardware preset whose card is not the one present.

The GPUs are read from nvidia-smi (no CUDA is initialised): the ones CUDA_VISIBLE_DEVICES leaves visible, by
index or UUID. A known card brings its nominal memory, HBM bandwidth and dense bf16 peak (the planner's roofline
needs them) from the card table, rlgen.config.cards; an unknown one its memory as nvidia-smi gives it, and no
prediction."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from rlgen.config import GPUSpec, HardwareConfig
from rlgen.config.cards import CARDS, Card
from rlgen.gpubusy import smi_rows
from rlgen.gpustart import visible_devices

AUTO = "auto"  # hardware=auto: the plan reads this machine's GPUs (and names the result auto:<what it found>)
MEMORY_SLACK = 0.03  # a card with at most 3% fewer bytes than a preset's nominal GB still counts as that size


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str  # as nvidia-smi gives it, e.g. "NVIDIA H100 80GB HBM3"
    memory_mib: int

    @property
    def gib(self) -> float:
        return self.memory_mib / 1024


def _query() -> str:
    """nvidia-smi's index, uuid, name and memory of every GPU as CSV ("" where it cannot be run)."""
    return "\n".join(smi_rows("index,uuid,name,memory.total"))


def parse(csv: str, visible: str = "all") -> list[Gpu]:
    """The GPUs of nvidia-smi's CSV that a CUDA_VISIBLE_DEVICES value of ``visible`` leaves, in its order."""
    gpus = []
    for line in csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit() and parts[3].isdigit():
            gpus.append(Gpu(int(parts[0]), parts[1], parts[2], int(parts[3])))
    if visible == "all":
        return gpus
    picked = []
    for item in (x.strip() for x in visible.split(",")):
        match = [g for g in gpus if item == str(g.index) or (item and g.uuid.startswith(item))]
        if not match:
            break  # CUDA stops at the first name it cannot find
        picked.append(match[0])
    return picked


def visible_gpus() -> list[Gpu]:
    """This machine's GPUs that this process may use (none without nvidia-smi)."""
    return parse(_query(), visible_devices())


def card_of(gpu: Gpu) -> Card | None:
    """The known card a GPU is, or None: the first in CARDS whose nvidia-smi name it has, the nearest in memory
    among cards of that name."""
    named = [c for c in CARDS if c.smi in gpu.name]
    if not named:
        return None
    smi = named[0].smi
    return min((c for c in named if c.smi == smi), key=lambda c: abs(c.spec.memory_gb - gpu.gib))


def spec_of(gpu: Gpu) -> GPUSpec:
    """The GPUSpec a plan uses for the GPU: a known card's, else its own memory and no roofline figures."""
    card = card_of(gpu)
    return dataclasses.replace(card.spec) if card else GPUSpec(gpu.name.replace(" ", "-"), float(int(gpu.gib)))


def found(gpus: list[Gpu]) -> str:
    """What was found, in words: "4 x NVIDIA H100 80GB HBM3 (79.6 GiB)"."""
    if not gpus:
        return "no NVIDIA GPU"
    names = sorted({g.name for g in gpus})
    return " and ".join(f"{sum(g.name == n for g in gpus)} x {n} ({min(g.gib for g in gpus if g.name == n):.1f} "
                        "GiB)" for n in names)


def preset_for(gpus: list[Gpu], presets: list[str]) -> str | None:
    """The hardware preset made for these GPUs (their count and card), when there is one."""
    card = card_of(gpus[0]) if gpus else None
    name = f"{len(gpus)}x{card.key}" if card else ""
    return name if name in presets else None


def auto_hardware(gpus: list[Gpu], cpus: int | None = None) -> HardwareConfig:
    """hardware=auto for these GPUs, on one node: CPU actors without any; one GPU shared by engines and the
    learner; else the layout left to the plan, as the presets leave it. Mixed cards are planned as the one with
    the least memory."""
    cpus = cpus or os.cpu_count() or 1
    if not gpus:
        return HardwareConfig(name=AUTO, cpus_per_node=cpus)
    n = len(gpus)
    spec = spec_of(min(gpus, key=lambda g: g.memory_mib))
    one = n == 1
    return HardwareConfig(name=AUTO, nodes=1, gpus_per_node=n, cpus_per_node=cpus, gpu=spec,
                          engine_gpus=1 if one else None, learner_gpus=1 if one else None, colocated=True if one else None)


def mismatch(hw: HardwareConfig, gpus: list[Gpu], presets: list[str]) -> tuple[str | None, str | None]:
    """(a refusal, a warning) for a preset whose card is not these GPUs': fewer GB than it assumes is refused
    (the plan would not fit); more GB (memory left unused) or another card of the size (other predicted times) is
    a warning."""
    if hw.name.startswith(AUTO) or not hw.gpus_per_node or not gpus:
        return None, None
    small = min(gpus, key=lambda g: g.memory_mib)
    have = spec_of(small)
    if have.name == hw.gpu.name:
        return None, None
    right = preset_for(gpus[: hw.gpus_per_node], presets) if len(gpus) >= hw.gpus_per_node else None
    fix = f"use hardware={right} (made for them) or hardware=auto" if right else "use hardware=auto"
    said = (f"hardware={hw.name} assumes {hw.gpu.memory_gb:g} GB {hw.gpu.name} GPUs, but this machine's are "
            f"{small.name} with {small.gib:.1f} GiB")
    if small.memory_mib * 2**20 / 1e9 < hw.gpu.memory_gb * (1 - MEMORY_SLACK):
        return (f"{said}, so its memory plan does not fit them; {fix}, or give the card as hardware.gpu.name= "
                "and hardware.gpu.memory_gb=."), None
    why = ("its memory plan leaves their extra memory unused" if have.memory_gb > hw.gpu.memory_gb else
           f"its predicted times are {hw.gpu.name}'s")
    return None, f"{said}; {why} ({fix})."


__all__ = ["AUTO", "Card", "Gpu", "auto_hardware", "card_of", "found", "mismatch", "parse", "preset_for",
           "spec_of", "visible_gpus"]
