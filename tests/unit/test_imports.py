"""Config, compose, plan and `rlgen plan` stay light: no torch, ray or vllm behind them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

HEAVY = ("torch", "ray", "vllm")

PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys

    stage = {}

    def heavy():
        return sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))

    import rlgen.config, rlgen.plan, rlgen.config.compose, rlgen.cli
    stage["import"] = heavy()

    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan
    from rlgen.plan.placement import plan_bundles
    plan = build_plan(compose_run_config(["engine=vllm_tp2", "hardware=2x8xh100", "hardware.engine_gpus=8"]))
    plan_bundles(plan)
    build_plan(compose_run_config([]))
    stage["plan"] = heavy()

    with contextlib.redirect_stdout(io.StringIO()):
        rc = rlgen.cli.main(["plan", "engine=vllm", "hardware=1xh100"])
    stage["cli"] = heavy()
    stage["rc"] = rc
    stage["engines"] = len(plan.engines)
    print(json.dumps(stage))
    """
)


def run_probe(code: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{code}"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_config_compose_plan_and_cli_do_not_import_heavy_packages():
    stage = run_probe(PROBE)
    assert stage["engines"] == 4 and stage["rc"] == 0  # the probe really composed, planned and ran the CLI
    assert stage["import"] == [], f"importing the config modules pulled in {stage['import']}"
    assert stage["plan"] == [], f"composing and planning pulled in {stage['plan']}"
    assert stage["cli"] == [], f"`rlgen plan` pulled in {stage['cli']}"


def test_the_probe_notices_a_heavy_import():
    # The check above is only worth something if it sees such an import when one happens: plant a stand-in
    # torch submodule before the probe runs.
    stage = run_probe(
        "import sys, types\nsys.modules['torch.cuda'] = types.ModuleType('torch.cuda')\n" + PROBE
    )
    assert stage["import"] == stage["plan"] == stage["cli"] == ["torch"]
