"""rlgen train fixes its run directory before Hydra starts (to lock it before anything is written there): the
directory Hydra would have made, ${now:...} filled in, handed back to Hydra's parser unchanged."""

from __future__ import annotations

import datetime

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from rlgen.commands.run_dirs import fill_now, hydra_quoted
from rlgen.config.compose import run_dir_template


@pytest.mark.parametrize("path", ["outputs/2026-11-26/13-18-02", "/data/a b/c'd", "/data/x\\y", "/data/a,b=c",
                                  "~/runs/x", "/data/x\\'y", "/data/end\\", "runs/[1]{2}"])
def test_a_path_goes_through_hydras_parser_unchanged(path):
    override = OverridesParser.create().parse_override(f"hydra.run.dir={hydra_quoted(path)}")
    assert override.value() == path


def test_the_default_directory_is_hydras_with_the_time_filled_in():
    raw = run_dir_template(["steps=3"])
    assert raw == "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}"
    assert fill_now(raw, datetime.datetime(2026, 11, 26, 13, 5, 9)) == "outputs/2026-11-26/13-05-09"
    assert run_dir_template(["hydra.run.dir=/data/r"]) == "/data/r"


def test_a_directory_only_hydra_can_resolve_is_left_to_the_run():
    assert fill_now("runs/${hydra.job.name}/${now:%H}") is None
