"""Hardware presets name a card of the one card table (rlgen.config.cards) and give counts: each resolves to the
figures it has always had, overrides of hardware.gpu still apply, README's list of presets is the folder's, and a
card that is not in the table is refused in one sentence."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest

import rlgen.config.compose
from rlgen.cli import main as cli_main
from rlgen.config.cards import CARDS, CARDS_GROUP, GPUSpec, card, unknown_card
from rlgen.config.compose import CONF_DIR, ConfigError, compose_run_config, group_options
from rlgen.plan.checks import cards as detected

REPO = Path(__file__).resolve().parents[2]

H100 = {"name": "H100-SXM-80GB", "memory_gb": 80.0, "hbm_tbps": 3.35, "bf16_tflops": 989.0}
H200 = {"name": "H200-SXM-141GB", "memory_gb": 141.0, "hbm_tbps": 4.8, "bf16_tflops": 989.0}
NONE = {"name": "none", "memory_gb": 0.0, "hbm_tbps": 0.0, "bf16_tflops": 0.0}
LEFT = {"engine_gpus": None, "learner_gpus": None, "colocated": None}  # the layout is the plan's
SHARED = {"engine_gpus": 1, "learner_gpus": 1, "colocated": True}
CPU = {"engine_gpus": 0, "learner_gpus": 0, "colocated": False}


def _hw(name: str, nodes: int, gpus: int, cpus: int, gpu: dict, layout: dict, ranks: int = 1) -> dict:
    return {"name": name, "nodes": nodes, "gpus_per_node": gpus, "cpus_per_node": cpus, "gpu": gpu, **layout,
            "learner_ranks": ranks}


# Every preset's hardware as its YAML file spelled it out, card figures included, before presets named cards.
EXPECTED = {
    "1xh100": _hw("1xh100", 1, 1, 16, H100, SHARED),
    "2xh100": _hw("2xh100", 1, 2, 32, H100, LEFT),
    "4xh100": _hw("4xh100", 1, 4, 64, H100, LEFT),
    "8xh100": _hw("8xh100", 1, 8, 128, H100, LEFT),
    "2x8xh100": _hw("2x8xh100", 2, 8, 128, H100, LEFT),
    "1xh200": _hw("1xh200", 1, 1, 16, H200, SHARED),
    "2xh200": _hw("2xh200", 1, 2, 32, H200, LEFT),
    "4xh200": _hw("4xh200", 1, 4, 64, H200, LEFT),
    "8xh200": _hw("8xh200", 1, 8, 128, H200, LEFT),
    "cpu": _hw("cpu", 1, 0, 2, NONE, CPU),
    "2xcpu": _hw("2xcpu", 2, 0, 2, NONE, CPU),
    "auto": _hw("auto", 1, 0, 2, NONE, CPU),  # filled from this machine's GPUs when the plan is made
}


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_every_preset_resolves_to_the_figures_it_always_had(preset):
    assert dataclasses.asdict(compose_run_config([f"hardware={preset}"]).hardware) == EXPECTED[preset]


@pytest.mark.parametrize("preset", group_options("hardware"))
def test_every_gpu_preset_of_the_folder_holds_a_card_of_the_table(preset):
    hw = compose_run_config([f"hardware={preset}"]).hardware
    assert hw.gpus_per_node == 0 or hw.gpu in [c.spec for c in CARDS]


def test_overrides_of_the_cards_figures_still_apply():
    gpu = compose_run_config(["hardware=1xh100", "hardware.gpu.memory_gb=40"]).hardware.gpu
    assert dataclasses.asdict(gpu) == {**H100, "memory_gb": 40.0}
    # a preset's card renamed and resized on the command line (docs/benchmarks.md): its other figures stay
    gpu = compose_run_config(["hardware=2xh200", "hardware.gpu.name=H100-SXM-80GB",
                              "hardware.gpu.memory_gb=80"]).hardware.gpu
    assert dataclasses.asdict(gpu) == {**H200, "name": "H100-SXM-80GB", "memory_gb": 80.0}


@pytest.mark.parametrize("row", CARDS, ids=[c.key for c in CARDS])
def test_every_card_of_the_table_composes_and_is_what_auto_finds(row):
    hw = compose_run_config(["hardware=8xh100", f"{CARDS_GROUP}={row.key}"]).hardware
    assert hw.gpu == row.spec and hw.gpus_per_node == 8
    gpu = detected.Gpu(0, "GPU-0", f"NVIDIA {row.smi}", int(row.spec.memory_gb * 1e9 / 2**20))
    assert detected.card_of(gpu) is row and detected.spec_of(gpu) == row.spec


def test_card_keys_are_distinct_config_names():
    keys = [c.key for c in CARDS]
    assert len(set(keys)) == len(keys) and all(re.fullmatch(r"[a-z][a-z0-9_]*", k) for k in keys)
    assert card("h200").spec == GPUSpec(**H200)


def test_readme_lists_the_hardware_presets_of_the_folder():
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| `hardware` |"))
    listed = re.findall(r"`([^`]+)`", row.split("|")[2])
    assert len(listed) == len(set(listed)), f"README's hardware row names a preset twice: {listed}"
    files = {p.stem for p in (CONF_DIR / "hardware").glob("*.yaml")}
    assert set(listed) == {name for name in files if not name.startswith("base_")}


@pytest.fixture
def preset_of_an_unknown_card(tmp_path, monkeypatch):
    """A copy of the config tree with hardware=1xh300, a preset whose card (h300) is not in the table."""
    tree = tmp_path / "conf"
    shutil.copytree(CONF_DIR, tree)
    text = (tree / "hardware" / "1xh100.yaml").read_text()
    assert "gpu: h100," in text
    (tree / "hardware" / "1xh300.yaml").write_text(text.replace("gpu: h100,", "gpu: h300,"))
    monkeypatch.setattr(rlgen.config.compose, "CONF_DIR", tree)


def test_a_preset_naming_an_unknown_card_is_refused_in_one_sentence(preset_of_an_unknown_card):
    with pytest.raises(ConfigError) as info:
        compose_run_config(["hardware=1xh300"])
    assert str(info.value) == unknown_card("h300", "conf/hardware/1xh300.yaml: ")
    assert str(info.value).startswith("conf/hardware/1xh300.yaml: the GPU card 'h300' is not a known card; name "
                                      "one of h200 (H200-SXM-141GB), ")
    assert "h100 (H100-SXM-80GB)" in str(info.value) and "add it as a row of CARDS" in str(info.value)


def test_an_unknown_card_on_the_command_line_is_one_line_and_exit_2(capsys):
    assert cli_main(["plan", "hardware=1xh100", f"{CARDS_GROUP}=h300"]) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1
    assert f"{CARDS_GROUP}=h300: the GPU card 'h300' is not a known card; name one of " in text
    with pytest.raises(KeyError) as info:
        card("h300")
    assert info.value.args == (unknown_card("h300"),)


def test_swapping_the_card_of_a_preset_without_one_names_the_presets_made_for_it():
    with pytest.raises(ConfigError, match=re.escape(f"{CARDS_GROUP}=h100 replaces the card of a GPU preset, and "
                                                    "hardware=cpu names none (it has no GPUs); choose a preset made "
                                                    "for H100-SXM-80GB GPUs: hardware=1xh100")):
        compose_run_config(["hardware=cpu", f"{CARDS_GROUP}=h100"])
