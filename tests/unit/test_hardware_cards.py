"""This machine's GPUs (a faked nvidia-smi list): which ones a run gets, hardware=auto's plan, the H100 presets,
and the one sentence for a preset whose card is not the one present."""

from __future__ import annotations

import pytest

from rlgen.config.compose import compose_run_config, group_options
from rlgen.plan.build import build_plan
from rlgen.plan.checks import cards
from rlgen.plan.checks.machine import check_cards
from rlgen.plan.preflight import preflight

H100 = "NVIDIA H100 80GB HBM3, 81559"
H200 = "NVIDIA H200, 143771"


def smi(*rows: str) -> str:
    return "".join(f"{i}, GPU-{i:04d}-uuid, {row}\n" for i, row in enumerate(rows))


@pytest.fixture
def machine(monkeypatch):
    """Fake this machine's GPUs: machine(rows, visible=None) sets nvidia-smi's answer and CUDA_VISIBLE_DEVICES."""

    def fake(*rows: str, visible: str | None = None) -> None:
        monkeypatch.setattr(cards, "_query", lambda: smi(*rows))
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)

    return fake


def test_a_run_gets_the_gpus_cuda_visible_devices_leaves_in_its_order(machine):
    machine(H100, H100, H200, H100, visible="3,GPU-0002")
    assert [(g.index, g.name) for g in cards.visible_gpus()] == [(3, "NVIDIA H100 80GB HBM3"), (2, "NVIDIA H200")]
    machine(H100, H100, visible="1,7,0")  # CUDA stops at the first device it cannot find
    assert [g.index for g in cards.visible_gpus()] == [1]
    machine(H100, H100)
    assert [g.index for g in cards.visible_gpus()] == [0, 1]
    assert cards.parse("Failed to initialize NVML: Driver/library version mismatch\n") == []


def test_known_cards_bring_their_spec_and_unknown_ones_their_memory():
    def gpu(name: str, mib: int) -> cards.Gpu:
        return cards.Gpu(0, "GPU-x", name, mib)

    assert cards.spec_of(gpu("NVIDIA H100 80GB HBM3", 81559)).name == "H100-SXM-80GB"
    assert cards.spec_of(gpu("NVIDIA H100 PCIe", 81559)).hbm_tbps == 2.0
    assert cards.spec_of(gpu("NVIDIA H200", 143771)).memory_gb == 141
    assert cards.spec_of(gpu("NVIDIA A100-SXM4-40GB", 40960)).name == "A100-40GB"
    assert cards.spec_of(gpu("NVIDIA A100 80GB PCIe", 81920)).name == "A100-80GB"
    odd = cards.spec_of(gpu("Some Card 9000", 49152))
    assert (odd.name, odd.memory_gb, odd.bf16_tflops) == ("Some-Card-9000", 48.0, 0.0)  # no roofline: no prediction


@pytest.mark.parametrize("n, engines, learners, colocated", [(1, 1, 1, True), (2, None, None, None),
                                                             (4, None, None, None), (8, None, None, None),
                                                             (3, None, None, None)])
def test_auto_leaves_the_layout_to_the_plan_as_the_presets_do(n, engines, learners, colocated):
    hw = cards.auto_hardware([cards.Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559) for i in range(n)], cpus=16)
    assert (hw.gpus_per_node, hw.engine_gpus, hw.learner_gpus, hw.colocated) == (n, engines, learners, colocated)
    assert hw.gpu.name == "H100-SXM-80GB" and hw.cpus_per_node == 16
    if n in (1, 2, 4, 8):
        preset = compose_run_config([f"hardware={n}xh100"]).hardware
        assert (preset.engine_gpus, preset.learner_gpus, preset.colocated, preset.gpu) == (
            hw.engine_gpus, hw.learner_gpus, hw.colocated, hw.gpu)
    assert cards.auto_hardware([], cpus=2).gpus_per_node == 0


def test_mixed_cards_are_planned_as_the_smallest():
    gpus = [cards.Gpu(0, "a", "NVIDIA H200", 143771), cards.Gpu(1, "b", "NVIDIA H100 80GB HBM3", 81559)]
    assert cards.auto_hardware(gpus).gpu.name == "H100-SXM-80GB"
    assert cards.found(gpus) == "1 x NVIDIA H100 80GB HBM3 (79.6 GiB) and 1 x NVIDIA H200 (140.4 GiB)"


def test_rlgen_plan_with_hardware_auto_plans_for_what_it_found_and_says_so(machine):
    machine(H100, H100, H100, H100)
    plan = build_plan(compose_run_config(["hardware=auto", "engine=vllm", "model=qwen2_5_1_5b"]))
    assert plan.hardware == "auto:4xh100" and plan.gpus_per_node == 4
    assert len(plan.engines) == 8 and len(plan.learners) == 4  # the layout the plan picked: hybrid
    said = plan.settings[0]
    assert said.key == "hardware" and said.value == "4 x H100-SXM-80GB: engines and learners share them"
    assert said.source == ("detected: 4 x NVIDIA H100 80GB HBM3 (79.6 GiB) on this machine, the GPUs "
                           "hardware=4xh100 is made for")
    machine(H100, H100, H100, H100, visible="2")
    one = build_plan(compose_run_config(["hardware=auto", "engine=vllm", "model=qwen2_5_0_5b"]))
    assert one.hardware == "auto:1xh100" and one.colocated
    machine()
    cpu = build_plan(compose_run_config(["hardware=auto"]))
    assert cpu.device == "cpu" and cpu.hardware == "auto:cpu"
    assert cpu.settings[0].source == "detected: no NVIDIA GPU on this machine"


def test_the_h100_presets_exist_and_plan():
    assert {"2xh100", "4xh100", "auto"} <= set(group_options("hardware"))
    four = build_plan(compose_run_config(["hardware=4xh100", "engine=vllm", "model=qwen2_5_1_5b"]))
    assert four.gpus_per_node == 4 and len(four.learners) == 4 and four.colocated  # the plan's pick: hybrid
    two = build_plan(compose_run_config(["hardware=2xh100", "engine=vllm", "model=qwen2_5_1_5b",
                                         "hardware.colocated=false"]))
    assert len(two.engines) == 1 and len(two.learners) == 1 and not two.colocated


def test_a_preset_for_bigger_cards_is_refused_and_one_for_smaller_cards_is_a_warning(machine):
    presets = group_options("hardware")
    machine(H100, H100)
    problems: list[str] = []
    notes: list[str] = []
    check_cards(compose_run_config(["hardware=2xh200"]), problems, notes)
    assert problems == ["hardware=2xh200 assumes 141 GB H200-SXM-141GB GPUs, but this machine's are NVIDIA H100 "
                        "80GB HBM3 with 79.6 GiB, so its memory plan does not fit them; use hardware=2xh100 (made "
                        "for them) or hardware=auto, or give the card as hardware.gpu.name= and "
                        "hardware.gpu.memory_gb=."] and notes == []
    h200s = [cards.Gpu(0, "a", "NVIDIA H200", 143771)]
    refusal, warning = cards.mismatch(compose_run_config(["hardware=1xh100"]).hardware, h200s, presets)
    assert refusal is None and warning.startswith("hardware=1xh100 assumes 80 GB H100-SXM-80GB GPUs, but this "
                                                  "machine's are NVIDIA H200 with 140.4 GiB; its memory plan leaves")
    assert "use hardware=1xh200 (made for them)" in warning
    h100s = [cards.Gpu(0, "a", "NVIDIA H100 80GB HBM3", 81559)]
    assert cards.mismatch(compose_run_config(["hardware=1xh100"]).hardware, h100s, presets) == (None, None)
    a100 = [cards.Gpu(0, "a", "NVIDIA A100-SXM4-80GB", 81920)]
    refusal, warning = cards.mismatch(compose_run_config(["hardware=1xh100"]).hardware, a100, presets)
    assert refusal is None and "its predicted times are H100-SXM-80GB's (use hardware=auto)" in warning
    l4 = [cards.Gpu(0, "a", "NVIDIA L4", 23034)]
    assert "use hardware=auto, or give" in cards.mismatch(compose_run_config(["hardware=1xh100"]).hardware, l4,
                                                          presets)[0]  # no preset for it


def test_train_and_plan_get_the_sentence_before_anything_starts(machine, monkeypatch):
    from rlgen.plan.checks import machine as machine_checks

    machine(H200)
    monkeypatch.setattr(machine_checks, "local_gpus", lambda: 1)
    report = preflight(compose_run_config(["hardware=1xh100", "engine=vllm", "model=qwen2_5_0_5b"]))
    assert any("its memory plan leaves their extra memory unused" in n for n in report.machine_notes)
    assert not any("H100-SXM-80GB" in m for m in report.blocking())  # a warning, not a refusal
    machine(H100)
    report = preflight(compose_run_config(["hardware=1xh200", "engine=vllm", "model=qwen2_5_0_5b"]))
    assert any("use hardware=1xh100 (made for them)" in m for m in report.blocking())
