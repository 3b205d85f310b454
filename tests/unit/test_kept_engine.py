"""engines.kept_warm.KeptWarm: what an engine does when its run ends and it stays (keep_for_next_run), and when a
new run takes it over (take_over)."""

from __future__ import annotations

from rlgen.engines.kept_warm import KeptWarm
from rlgen.phases import ActorClock


class _Engine(KeptWarm):
    def __init__(self, sleeps: bool, restores: bool = True):
        self.name, self.asleep, self.version, self.sleeps, self.restores = "engine0", False, 7, sleeps, restores
        self.clock, self.calls = ActorClock(), []

    def _tidy(self) -> None:
        self.calls.append("tidy")

    def _restore_start_weights(self) -> bool:
        if self.restores:
            self.calls.append("restore")
            self.version = 0
        return self.restores

    def _sleeps_while_kept(self) -> bool:
        return self.sleeps

    def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep{level}")
        self.asleep = True

    def wake(self) -> None:
        self.calls.append("wake")
        self.asleep = False

    def health(self) -> dict:
        return {"ok": True, "name": self.name, "version": self.version, "startup": self.clock.to_dict()}


def test_keep_for_next_run_tidies_restores_the_starting_weights_and_sleeps_where_sleeping_frees_memory():
    gpu, cpu = _Engine(sleeps=True), _Engine(sleeps=False)
    assert gpu.keep_for_next_run(1) == {"name": "engine0", "asleep": True, "start_weights": True}
    assert gpu.calls == ["tidy", "restore", "sleep1"]  # restored while awake, then asleep
    assert cpu.keep_for_next_run(1) == {"name": "engine0", "asleep": False, "start_weights": True}
    assert cpu.calls == ["tidy", "restore"]


def test_take_over_says_whether_the_engine_holds_its_starting_weights_once():
    kind_that_cannot = _Engine(sleeps=False, restores=False)
    kind_that_cannot.keep_for_next_run(1)
    assert kind_that_cannot.take_over(0)["start_weights"] is False
    engine = _Engine(sleeps=True)
    engine.keep_for_next_run(1)
    assert engine.take_over(0)["start_weights"] is True
    # its run's updates come after take_over: a second take-over with no keep_for_next_run between must not
    # claim them
    assert engine.take_over(0)["start_weights"] is False


def test_take_over_wakes_takes_the_version_and_times_only_itself():
    engine = _Engine(sleeps=True)
    old = engine.clock
    engine.keep_for_next_run(1)
    health = engine.take_over(0)
    assert engine.calls[-1] == "wake" and not engine.asleep
    assert health["version"] == 0 and health["kept_warm"] == 1
    startup = health["startup"]
    assert engine.clock is not old and list(startup["steps"]) == ["wake (kept warm)"]
    assert startup["process_start"] == startup["init_begin"] <= startup["init_end"]
    engine.keep_for_next_run(1)
    assert engine.take_over(3)["kept_warm"] == 2


def test_an_awake_engine_is_not_woken():
    engine = _Engine(sleeps=False)
    engine.keep_for_next_run(1)
    engine.take_over(0)
    assert "wake" not in engine.calls
