"""An engine whose node left the cluster: which node its bundle may go to (pure), and what the keeper does with
the answer (moves it and re-creates it there, or stops the run with a sentence naming the node)."""

from __future__ import annotations

import pytest
import ray
from ray.exceptions import RayActorError

import rlgen.runtime.rollouts.engine_restarts as restarts
from rlgen.runtime.cluster.nodes import spare_nodes
from rlgen.runtime.rollouts.engine_restarts import EngineKeeper, EngineLost


def test_spare_nodes_prefer_nodes_without_the_runs_groups_and_need_room():
    free = {"learners": {"CPU": 3.0}, "big": {"CPU": 8.0}, "small": {"CPU": 1.0}, "full": {"CPU": 0.5},
            "dead": {"CPU": 8.0}, "gpu": {"CPU": 4.0, "GPU": 1.0}}
    assert spare_nodes({"CPU": 1.0}, free, held={"learners"}, gone={"dead"}) == ["small", "big", "gpu", "learners"]
    assert spare_nodes({"CPU": 1.0, "GPU": 1.0}, free, held=set(), gone=set()) == ["gpu"]
    assert spare_nodes({"CPU": 4.0}, free, held={"learners", "big"}, gone={"dead"}) == ["gpu", "big"]
    assert spare_nodes({"CPU": 2.0, "GPU": 1.0}, {"gpu": {"CPU": 1.0, "GPU": 1.0}}, set(), set()) == []


def _keeper(monkeypatch, alive: set[str], place_again):
    monkeypatch.setattr(ray, "kill", lambda a, no_restart=True: None)  # the stand-in actors are plain strings
    monkeypatch.setattr(restarts, "node_alive", lambda node: node in alive)
    monkeypatch.setattr(restarts, "node_name", lambda node: f"10.0.0.9 ({node[:8]})")
    where = {0: "nodeAAAAAAAAAA", 1: "nodeAAAAAAAAAA"}
    said: list[str] = []

    def moved(i: int, gone: str):
        new = place_again(i, gone)
        if new is not None:
            where[i] = new
        return new

    keeper = EngineKeeper([object(), object()], ["engine0", "engine1"], max_restarts=3,
                          create=lambda i: f"actor{i}@{where[i]}", ready=lambda actor, what: None,
                          resync=lambda i, actor, resend: None, say=said.append, node_of=where.__getitem__,
                          place_again=moved)
    return keeper, said


def test_an_engine_whose_node_left_is_recreated_where_its_bundle_was_placed_again(monkeypatch):
    keeper, said = _keeper(monkeypatch, {"nodeCCCCCCCCCC"}, lambda i, gone: "nodeCCCCCCCCCC")
    keeper.replace(0, RayActorError())
    assert keeper.engines[0] == "actor0@nodeCCCCCCCCCC" and keeper.restarts == [1, 0] and keeper.incarnation == [1, 0]
    assert "its node 10.0.0.9 (nodeAAAA) left the Ray cluster; placed again on 10.0.0.9 (nodeCCCC)" in said[0]


def test_without_room_the_keeper_stops_naming_the_node_and_what_it_held(monkeypatch):
    keeper, said = _keeper(monkeypatch, {"nodeBBBBBBBBBB"}, lambda i, gone: None)
    with pytest.raises(EngineLost, match=r"^the node 10\.0\.0\.9 \(nodeAAAA\) left the Ray cluster with engine0, "
                                         r"engine1 on it, and no other node has room for engine1; resume=auto "
                                         r"continues the run once the cluster has the resources again$"):
        keeper.replace(1, RayActorError())
    assert keeper.restarts == [0, 0] and not said


def test_an_engine_whose_node_dies_while_it_is_recreated_there_is_moved_then(monkeypatch):
    """The engine's calls broke before Ray marked its node dead: the first new actor, in the old place, fails as
    the node is marked dead, and the engine is moved."""
    alive = {"nodeAAAAAAAAAA", "nodeCCCCCCCCCC"}
    keeper, said = _keeper(monkeypatch, alive, lambda i, gone: "nodeCCCCCCCCCC")

    def ready(actor, what):
        if actor.endswith("nodeAAAAAAAAAA"):
            alive.discard("nodeAAAAAAAAAA")
            raise RuntimeError("restarting engine0 failed because an actor died")

    keeper._ready = ready
    keeper.replace(0, RayActorError())
    assert keeper.engines[0] == "actor0@nodeCCCCCCCCCC" and keeper.restarts == [1, 0]
    assert "placed again on 10.0.0.9 (nodeCCCC)" in said[0]


def test_a_new_actor_that_fails_on_a_live_node_is_not_retried(monkeypatch):
    keeper, said = _keeper(monkeypatch, {"nodeAAAAAAAAAA"}, lambda i, gone: "nodeCCCCCCCCCC")

    def ready(actor, what):
        raise RuntimeError("it raised")

    keeper._ready = ready
    with pytest.raises(RuntimeError, match="it raised"):
        keeper.replace(0, RayActorError())
    assert not said
