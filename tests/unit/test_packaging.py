"""pyproject.toml as setuptools reads it: metadata in the current forms, so an install prints no deprecation."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_license_is_an_spdx_expression_with_a_setuptools_that_reads_it():
    data = tomllib.loads(PYPROJECT.read_text())
    # a table ({text = ...}) is deprecated and setuptools prints a warning box for it on every build
    assert data["project"]["license"] == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in data["project"].get("classifiers", []))
    setuptools = next(Requirement(r) for r in data["build-system"]["requires"] if Requirement(r).name == "setuptools")
    # setuptools takes project.license as an SPDX string from 77.0.0 on
    assert Version("76.9") not in setuptools.specifier and Version("77.0.0") in setuptools.specifier
