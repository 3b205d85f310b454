"""The GPU benchmark scripts run only on a GPU host, so their rlgen imports (most of them inside main()) are
checked here: every `from rlgen... import name` in benchmarks/*.py must name a module and attribute that exist.
A stale import would otherwise first show up as a failed GPU session."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py"))


def rlgen_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from rlgen... import name` in a script, nested ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rlgen":
            out.extend((node.module, alias.name) for alias in node.names)
    return out


def test_the_scripts_are_found():
    names = {p.name for p in BENCHMARKS}
    assert {"peer_trl.py", "vllm_tune.py", "engines_per_gpu.py"} <= names


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_every_rlgen_import_of_a_benchmark_resolves(path: Path):
    missing = []
    for module, name in rlgen_imports(path):
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{path.name} imports names that do not exist: {missing}"


def test_a_stale_import_is_caught(tmp_path: Path):
    script = tmp_path / "stale.py"
    script.write_text("def main():\n    from rlgen.bench import MemorySampler\n")
    (module, name), = rlgen_imports(script)
    assert not hasattr(importlib.import_module(module), name)
