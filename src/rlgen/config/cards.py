"""The GPU cards rlgen knows, in one table: each card's nominal memory, HBM bandwidth and dense bf16 peak (the
memory plan and the roofline read them).

A hardware preset names its card by key in its defaults list (``defaults: [base_hardware, gpu: h100, _self_]``
in conf/hardware/<preset>.yaml); the config tree then holds that card's figures at ``hardware.gpu``, where an
override such as ``hardware.gpu.memory_gb=40`` still changes one of them. ``hardware=auto`` finds the card of a
detected GPU in the same table, by what nvidia-smi calls it. A new card is one more row of CARDS (docs/plan.md,
"Adding a host")."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

CARDS_GROUP = "hardware/gpu"  # the config group a preset's `gpu: <key>` names an option of


@dataclass
class GPUSpec:
    name: str = "none"
    memory_gb: float = 0.0
    hbm_tbps: float = 0.0  # HBM bandwidth, TB/s
    bf16_tflops: float = 0.0  # dense bf16 peak, TFLOP/s


@dataclass(frozen=True)
class Card:
    """A GPU model: the key presets name it by, what nvidia-smi's name of it contains, and its figures."""

    key: str  # a preset's `gpu: <key>`; the presets made for it are named <n>x<key> (conf/hardware/)
    smi: str  # what nvidia-smi's name of such a GPU contains, e.g. "H100" in "NVIDIA H100 80GB HBM3"
    spec: GPUSpec


CARDS = (  # most specific nvidia-smi names first; among cards of one such name, the nearest memory wins
    Card("h200", "H200", GPUSpec("H200-SXM-141GB", 141, 4.8, 989)),
    Card("h100_nvl", "H100 NVL", GPUSpec("H100-NVL-94GB", 94, 3.9, 835)),
    Card("h100_pcie", "H100 PCIe", GPUSpec("H100-PCIe-80GB", 80, 2.0, 756)),
    Card("h100", "H100", GPUSpec("H100-SXM-80GB", 80, 3.35, 989)),
    Card("a100_80gb", "A100", GPUSpec("A100-80GB", 80, 2.0, 312)),
    Card("a100_40gb", "A100", GPUSpec("A100-40GB", 40, 1.555, 312)),
    Card("l40s", "L40S", GPUSpec("L40S-48GB", 48, 0.864, 362)),
    Card("l4", "L4", GPUSpec("L4-24GB", 24, 0.3, 121)),
    Card("a10", "A10", GPUSpec("A10-24GB", 24, 0.6, 125)),
)


def card(key: str) -> Card:
    """The card of a key (KeyError, with unknown_card's sentence, for a key not in CARDS)."""
    found = next((c for c in CARDS if c.key == key), None)
    if found is None:
        raise KeyError(unknown_card(key))
    return found


def register_cards(cs: Any) -> None:
    """Each card as an option of the hardware/gpu group of Hydra's ConfigStore ``cs``, so a preset's
    `gpu: <key>` brings the card's figures into hardware.gpu."""
    for c in CARDS:
        cs.store(group=CARDS_GROUP, name=c.key, node=GPUSpec(**vars(c.spec)))


def _gpus(preset: str, key: str) -> int | None:
    """The GPUs in all of a preset named <n>x<key> (2x8xh100: two nodes of eight), None for another name."""
    m = re.fullmatch(rf"((?:\d+x)+){re.escape(key)}", preset)
    if m is None:
        return None
    total = 1
    for n in m.group(1).rstrip("x").split("x"):
        total *= int(n)
    return total


def card_presets(key: str, presets: Iterable[str]) -> list[str]:
    """The hardware presets made for a card (named <n>x<key>, conf/hardware/), fewest GPUs first."""
    found = [(g, p) for p in presets if (g := _gpus(p, key)) is not None]
    return [p for _, p in sorted(found)]


def card_advice(key: str, presets: Iterable[str]) -> str:
    """Where a known card can go, as the fix of a sentence: the presets made for it, or, where none is, the card
    put on the smallest GPU preset."""
    presets = list(presets)
    made = card_presets(key, presets)
    if made:
        more = f" (or {', '.join(made[1:])})" if made[1:] else ""
        return f"choose a preset made for {card(key).spec.name} GPUs: hardware={made[0]}{more}"
    gpu = sorted((g, p) for c in CARDS for p in presets if (g := _gpus(p, c.key)) is not None)
    return f"put the card on a GPU preset: hardware={gpu[0][1]} {CARDS_GROUP}={key}" if gpu else (
        "add a GPU preset for it to conf/hardware/ (docs/plan.md, \"Adding a host\")")


def unknown_card(key: str, where: str = "") -> str:
    """The one sentence for a card key that is not in CARDS: the known keys, and how to add a card."""
    known = ", ".join(f"{c.key} ({c.spec.name})" for c in CARDS)
    return (f"{where}the GPU card {key!r} is not a known card; name one of {known}, or add it as a row of CARDS in "
            "src/rlgen/config/cards.py (docs/plan.md, \"Adding a host\").")


__all__ = ["CARDS", "CARDS_GROUP", "Card", "GPUSpec", "card", "card_advice", "card_presets", "register_cards",
           "unknown_card"]
