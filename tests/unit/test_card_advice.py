"""Advice about GPU cards that leads somewhere: a card added to a preset without GPUs is refused with the presets
made for that card (never hardware=cpu again), an unknown card key gets the unknown-card sentence, and swapping
the card of a preset that names none names a GPU preset, not the override that is refused next."""

from __future__ import annotations

import pytest

from rlgen.cli import main as cli_main
from rlgen.config.cards import CARDS_GROUP, unknown_card

H100_PRESETS = "hardware=1xh100 (or 2xh100, 4xh100, 8xh100, 2x8xh100)"


def _error(capsys, *argv: str) -> str:
    assert cli_main(list(argv)) == 2
    out = capsys.readouterr()
    lines = [ln for ln in (out.out + out.err).splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0].removeprefix("error: ")


@pytest.mark.parametrize("command", ["train", "plan"])
def test_a_card_on_a_preset_without_gpus_names_the_presets_made_for_it(capsys, command):
    said = _error(capsys, command, f"+{CARDS_GROUP}=h100")
    assert said == (f"hardware=cpu has no GPUs, so a GPU card means nothing on it; drop the +{CARDS_GROUP}=h100 "
                    f"override, or choose a preset made for H100-SXM-80GB GPUs: {H100_PRESETS}.")
    assert "use hardware=cpu" not in said


def test_a_card_no_preset_is_made_for_is_put_on_a_gpu_preset(capsys):
    said = _error(capsys, "plan", "hardware=2xcpu", f"+{CARDS_GROUP}=a100_80gb")
    assert said == (f"hardware=2xcpu has no GPUs, so a GPU card means nothing on it; drop the "
                    f"+{CARDS_GROUP}=a100_80gb override, or put the card on a GPU preset: hardware=1xh100 "
                    f"{CARDS_GROUP}=a100_80gb.")


def test_a_gpu_preset_without_gpus_keeps_its_sentence(capsys):
    said = _error(capsys, "plan", "engine=vllm", "hardware=4xh100", "hardware.gpus_per_node=0")
    assert said.startswith("hardware.gpus_per_node=0 leaves hardware=4xh100 without its H100-SXM-80GB GPUs; set "
                           "hardware.gpus_per_node to the GPUs each node has, or use hardware=cpu")


def test_an_unknown_card_swapped_in_gets_the_unknown_card_sentence(capsys):
    said = _error(capsys, "train", f"{CARDS_GROUP}=rtx9090")
    assert said == unknown_card("rtx9090", f"{CARDS_GROUP}=rtx9090: ")
    assert f"+{CARDS_GROUP}" not in said


def test_a_known_card_swapped_into_a_preset_without_one_names_a_gpu_preset(capsys):
    said = _error(capsys, "train", f"{CARDS_GROUP}=h100")
    assert said == (f"{CARDS_GROUP}=h100 replaces the card of a GPU preset, and hardware=cpu names none (it has no "
                    f"GPUs); choose a preset made for H100-SXM-80GB GPUs: {H100_PRESETS}.")
    assert f"+{CARDS_GROUP}" not in said
    said = _error(capsys, "plan", "hardware=2xcpu", f"{CARDS_GROUP}=l4")
    assert said == (f"{CARDS_GROUP}=l4 replaces the card of a GPU preset, and hardware=2xcpu names none (it has no "
                    f"GPUs); put the card on a GPU preset: hardware=1xh100 {CARDS_GROUP}=l4.")
