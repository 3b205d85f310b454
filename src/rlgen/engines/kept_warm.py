"""KeptWarm, the mixin behind the KeepsWarm capability (rlgen.engines.contract): keep_for_next_run() as a run ends
and the engine stays for the next run with the same settings, take_over() as that run takes it (``engine.keep_warm_s``;
the runtime side is rlgen.runtime.cluster.kept_engines). Imports nothing heavy."""

from __future__ import annotations

from typing import Any

from rlgen.phases import ActorClock


class KeptWarm:
    """For engine classes with name, asleep, version, clock, sleep(), wake() and health(). A kind overrides
    ``_tidy()`` with what must not pass from one run to the next, ``_restore_start_weights()`` and
    ``_sleeps_while_kept()``."""

    kept_runs = 0  # how many runs took this engine over
    holds_start_weights = False  # since keep_for_next_run(): the weights of its model folder, as a fresh engine has

    def _tidy(self) -> None:
        """Drop what belongs to the run that ends (paused requests, adapters, cached prefixes)."""

    def _restore_start_weights(self) -> bool:
        """Load the weights of the engine's model folder again, in place of the ones the run trained; False where
        the kind cannot (the next run's first weight push then brings its starting weights)."""
        return False

    def _sleeps_while_kept(self) -> bool:
        return False

    def keep_for_next_run(self, sleep_level: int = 1) -> dict[str, Any]:
        """The run ends and this engine stays: tidy up, take its starting weights back (so the next run can
        generate its first batch before its learners are ready), and sleep where that frees memory (level 1
        keeps the weights on the CPU, so take_over() wakes an engine that can generate at once)."""
        self._tidy()
        self.holds_start_weights = self._restore_start_weights()
        if self._sleeps_while_kept() and not self.asleep:
            self.sleep(sleep_level)
        return {"name": self.name, "asleep": self.asleep, "start_weights": self.holds_start_weights}

    def take_over(self, version: int) -> dict[str, Any]:
        """A new run takes this engine over: wake it, take the run's policy version, and answer health() with
        this start's timing and ``start_weights``: whether it holds its model folder's weights (else the run's
        first weight push must bring them before it generates)."""
        self.clock = clock = ActorClock()
        clock.process_start = clock.init_begin  # the process is there already
        if self.asleep:
            self.wake()
        clock.step("wake (kept warm)")
        self.version = int(version)
        self.kept_runs += 1
        held, self.holds_start_weights = self.holds_start_weights, False  # this run's updates come next
        clock.done()
        return {**self.health(), "kept_warm": self.kept_runs, "start_weights": held}


__all__ = ["KeptWarm"]
