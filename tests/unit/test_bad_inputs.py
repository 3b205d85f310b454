"""The corpus of user mistakes (tests/data/bad_inputs.yaml): each one exits non-zero with its one sentence, no
traceback, within 10 s, and before Ray or a run starts. In this process, with the run and Ray replaced by
tripwires; test_bad_inputs_cli.py runs a few the way a user does."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest
import yaml

CORPUS = Path(__file__).resolve().parent.parent / "data" / "bad_inputs.yaml"
CASES = yaml.safe_load(CORPUS.read_text())
LIMIT_S = 10.0


def _has(thing: str) -> bool:
    if thing == "gpu":
        from rlgen.plan.checks.machine import local_gpus

        return local_gpus() > 0
    return importlib.util.find_spec(thing) is not None


def _write_files(tmp: Path, files: dict) -> None:
    for name, content in (files or {}).items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content)
        elif "hex" in content:
            path.write_bytes(bytes.fromhex(content["hex"]))
        else:
            with open(path, "w") as f:
                f.write(content.get("prefix", ""))
                f.write(content["repeat"] * content["times"])
                f.write(content.get("suffix", ""))


def test_the_corpus_is_large_and_ids_are_unique():
    assert len(CASES) >= 60
    assert len({c["id"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_each_mistake_gets_one_sentence_before_anything_starts(case, tmp_path, capsys, monkeypatch, tripwires):
    present = [u for u in case.get("unless", []) if _has(u)]
    if present:
        pytest.skip(f"this machine has {', '.join(present)}")
    from rlgen.cli import main

    _write_files(tmp_path, case.get("files"))
    monkeypatch.syspath_prepend(str(tmp_path))  # reward modules written by the case
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    for key, value in (case.get("env") or {}).items():
        monkeypatch.setenv(key, value.replace("{tmp}", str(tmp_path)))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in case["argv"]]
    t0 = time.perf_counter()
    try:
        rc = main(argv)
    except SystemExit as exit_:
        rc = exit_.code
    elapsed = time.perf_counter() - t0
    out, err = capsys.readouterr()
    assert rc == 2, f"exit code {rc}; stderr: {err[-2000:]}"
    assert "Traceback" not in out + err
    assert case["expect"] in err, f"expected {case['expect']!r} in:\n{err}"
    assert err.startswith("error: "), err
    listed = [line for line in err.splitlines() if line.startswith("- ")]
    assert len(listed) == len(set(listed)), f"a problem is listed twice:\n{err}"
    assert elapsed < LIMIT_S, f"took {elapsed:.1f} s"
    assert not (tmp_path / "outputs").exists(), "a run directory was made for a config that cannot run"
    for name in (case.get("files") or {}):
        sys.modules.pop(Path(name).stem, None)  # a reward module of the same name in another case is new
