"""A sweep with points the checks refuse: the other points run, the refused ones are named before and after the
sweep, and the sweep exits 2. Hydra's multirun runs in this process, with the run itself replaced."""

from __future__ import annotations

from collections import defaultdict


def test_a_point_is_named_by_what_sets_it_apart():
    from rlgen.commands.sweep import common_overrides, point_label

    points = [["algo.lr=0.001", "steps=2"], ["algo.lr=-1", "steps=2"]]
    assert point_label(points[1], common_overrides(points)) == "algo.lr=-1"
    assert point_label(["steps=2"], common_overrides([["steps=2"]])) == "steps=2"


def test_a_sweep_with_a_refused_point_runs_the_others_and_exits_2(tmp_path, capsys, monkeypatch):
    import rlgen.commands.train as train
    from rlgen.cli import main

    ran = []

    def fake_run(plan, out, *args, **kwargs):
        ran.append(plan.config.algo.lr)
        return defaultdict(float)

    monkeypatch.setattr(train, "run_training", fake_run)
    monkeypatch.setenv("COLUMNS", "300")
    try:
        rc = main(["train", "-m", "algo.lr=1e-3,-1,nan,2e-3", "steps=2", "progress=false",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    except SystemExit as exit_:
        rc = exit_.code
    err = " ".join(capsys.readouterr().err.split())
    assert ran == [1e-3, 2e-3]  # the points that can run, ran
    assert rc == 2, err
    assert "note: 2 of 4 sweep points cannot run; the others run, and the sweep exits 2 at the end: algo.lr=-1 " \
           "(algo.lr=-1.0 must be > 0); algo.lr=nan (algo.lr=nan is not a finite number;" in err
    assert "error: 2 of 4 sweep points did not run to the end: algo.lr=-1 (rejected: algo.lr=-1.0 must be > 0); " \
           "algo.lr=nan (rejected: algo.lr=nan is not a finite number;" in err
    assert "Traceback" not in err


def test_a_sweep_whose_points_all_run_exits_0(tmp_path, capsys, monkeypatch):
    import rlgen.commands.train as train
    from rlgen.cli import main

    monkeypatch.setattr(train, "run_training", lambda *args, **kwargs: defaultdict(float))
    assert main(["train", "-m", "algo.lr=1e-3,2e-3", "steps=2", "progress=false",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}"]) == 0


def test_a_sweep_with_a_failed_point_exits_1(tmp_path, capsys, monkeypatch):
    import rlgen.commands.train as train
    from rlgen.cli import main
    from rlgen.runtime import RunError

    def fake_run(plan, out, *args, **kwargs):
        if plan.config.algo.lr > 1e-3:
            raise RunError("the learner cannot go on")
        return defaultdict(float)

    monkeypatch.setattr(train, "run_training", fake_run)
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["train", "-m", "algo.lr=1e-3,2e-3", "steps=2", "progress=false",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "error: 1 of 2 sweep points did not run to the end: algo.lr=0.002 (failed: the learner cannot go on" in err
