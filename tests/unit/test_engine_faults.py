"""The engine keeper: which failures mean an engine is gone, and how one is re-created (with or without the
current weights), counted, and taken down again when the new one cannot join."""

from __future__ import annotations

import pytest
import ray

from rlgen.engines.base import EngineDead, engine_died
from rlgen.runtime.rollouts.engine_restarts import EngineKeeper, EngineLost, death_detail


class Wrapped(Exception):
    """Stands for Ray's task error: the original exception under .cause."""

    def __init__(self, cause):
        super().__init__("wrapper")
        self.cause = cause


def _keeper(calls, ready_fails=False, max_restarts=3):
    def create(i):
        calls.append(("create", i))
        return f"actor{i}-{len(calls)}"

    def ready(actor, what):
        calls.append(("ready", actor))
        if ready_fails:
            raise RuntimeError("it could not start")

    return EngineKeeper(["old0"], ["engine0"], max_restarts, create, ready,
                        resync=lambda i, actor, resend: calls.append(("resync", actor, resend)),
                        say=lambda msg: calls.append(("say", msg)))


def test_an_engine_core_death_through_another_actors_call_counts_as_death():
    dead = EngineDead("engine0: pause(): the vLLM engine core died")
    through_learner = Wrapped(Wrapped(dead))  # an IPC update reaches the engine through the learner
    assert engine_died(through_learner) and death_detail(through_learner) == str(dead)
    assert not engine_died(Wrapped(ValueError("a reward function raised")))


def test_a_push_recreates_without_resync_and_counts_the_restart(monkeypatch):
    calls, killed = [], []
    monkeypatch.setattr(ray, "kill", lambda a, no_restart=True: killed.append(a))
    keeper = _keeper(calls)
    keeper.replace(0, EngineDead("engine0: the engine core died"), resync=False)
    assert killed == ["old0"] and keeper.incarnation == [1] and keeper.restarts == [1]
    assert ("resync", "actor0-1", False) in calls and keeper.engines == ["actor0-1"]


def test_a_new_engine_that_cannot_start_is_taken_down_again(monkeypatch):
    calls, killed = [], []
    monkeypatch.setattr(ray, "kill", lambda a, no_restart=True: killed.append(a))
    keeper = _keeper(calls, ready_fails=True)
    with pytest.raises(RuntimeError, match="could not start"):
        keeper.replace(0, EngineDead("gone"))
    assert killed == ["old0", "actor0-1"]  # the old one, then the new one that holds its GPU share
    assert keeper.engines == ["old0"] and keeper.incarnation == [0]


def test_past_max_restarts_the_run_stops(monkeypatch):
    monkeypatch.setattr(ray, "kill", lambda a, no_restart=True: None)
    keeper = _keeper([], max_restarts=0)
    with pytest.raises(EngineLost, match="engine0 died once, more than engine.max_restarts=0 allows"):
        keeper.replace(0, EngineDead("engine0: the engine core died"))
