"""Rollouts owns its queue of flights and the weight updates queued for the next one launched: a step takes the
oldest flight once it is collected, a step that runs again puts it back in front, the flight after it is there to
look at, and a launched flight takes the updates queued before it (engines apply them before its generate)."""

from __future__ import annotations

from types import SimpleNamespace

from rlgen.config.compose import compose_run_config
from rlgen.runtime.rollouts.batch import StepPrompts
from rlgen.runtime.rollouts.generation import Rollouts
from rlgen.runtime.rollouts.in_flight import InFlight
from rlgen.runtime.signals import StopFlag


def _rollouts(collected: list[int]) -> Rollouts:
    keeper = SimpleNamespace(engines=["e0", "e1"], incarnation=[0, 2], names=["engine0", "engine1"])
    ro = Rollouts(compose_run_config(["steps=5"]), SimpleNamespace(), None, SimpleNamespace(chat=False), [0], keeper,
                  SimpleNamespace(close=lambda: None), StopFlag())
    ro.new_flight = lambda step, version, async_steps=0: InFlight(step, StepPrompts(step, [], []), [[], []], version)
    ro._send = lambda flight: flight
    ro.collect = lambda flight, interruptible=True, launch=None: collected.append(flight.step)
    return ro


def test_a_step_takes_the_oldest_flight_once_collected_and_the_next_one_waits():
    collected: list[int] = []
    ro = _rollouts(collected)
    assert ro.ahead() is None and ro.collected == 0
    ro.fill(0, 2, version=0)  # steps 0, 1 and 2 launched
    assert [f.step for f in ro.waiting()] == [0, 1, 2]
    first = ro.next_flight()
    assert first.step == 0 and collected == [0] and ro.collected == 1
    assert ro.ahead() is not None and ro.ahead().step == 1
    assert [f.step for f in ro.waiting()] == [1, 2]


def test_a_step_that_runs_again_puts_its_flight_back_in_front():
    collected: list[int] = []
    ro = _rollouts(collected)
    ro.fill(0, 1, version=0)
    flight = ro.next_flight()
    ro.put_back(flight)
    assert [f.step for f in ro.waiting()] == [0, 1] and ro.ahead() is flight
    assert ro.next_flight() is flight and collected == [0, 0] and ro.collected == 2


def test_a_launched_flight_takes_the_updates_queued_before_it():
    ro = _rollouts([])
    ro.queue_updates(["update0", "update1"])
    ro.fill(0, 0, version=1)
    (flight,) = ro.waiting()
    assert flight.updates == {0: (0, "update0"), 1: (2, "update1")}  # each with its engine's incarnation
    assert ro.take_queued_updates() == {}
    ro.queue_updates(["a", "b"])
    ro.queue_updates(["c", "d"])  # a later update replaces what was queued
    assert ro.take_queued_updates() == {0: (0, "c"), 1: (2, "d")}
    assert ro.take_queued_updates() == {}
