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


class _Loop:
    """A vLLM engine's loop that records the calls made on it (none here may reach vLLM)."""

    def __init__(self):
        self.calls = []

    def run(self, coro, timeout_s, what):
        self.calls.append(what)
        coro.close()


class _LLM:
    async def _call(self):
        return None

    def collective_rpc(self, *args, **kwargs):
        return self._call()

    def reset_prefix_cache(self):
        return self._call()


def _vllm_engine(lora: bool, replaced: bool):
    from rlgen.engines.vllm.engine import VLLMEngine

    engine = object.__new__(VLLMEngine)  # its state only: no vLLM behind it
    engine.name, engine.args, engine.version, engine.folder_version = "engine0", {"enable_lora": lora}, 5, 0
    engine.asleep, engine.base_replaced, engine._loop, engine.llm = False, replaced, _Loop(), _LLM()
    return engine


def test_a_vllm_engine_that_took_adapters_alone_keeps_its_folders_weights_without_a_reload():
    adapters_only = _vllm_engine(lora=True, replaced=False)
    assert adapters_only._restore_start_weights() is True and adapters_only.version == 0
    assert adapters_only._loop.calls == []  # no reload_weights: vLLM fails it on a LoRA build
    whole_on_lora = _vllm_engine(lora=True, replaced=True)
    assert whole_on_lora._restore_start_weights() is False  # the next run's first push brings them
    assert whole_on_lora._loop.calls == []
    plain = _vllm_engine(lora=False, replaced=True)
    assert plain._restore_start_weights() is True and plain.version == 0 and not plain.base_replaced
    assert plain._loop.calls[0] == "engine0: loading its model folder's weights again"


def test_engines_that_cannot_be_kept_say_so_in_one_line(monkeypatch):
    from types import SimpleNamespace

    from rich.console import Console

    from rlgen.runtime import setup
    from rlgen.runtime.errors import RunError

    def fails(engines, wait):
        raise RunError("keeping the engines warm: engine0 raised ValueError: There is no module or parameter\n"
                       + "\n".join(f"  File 'vllm/x.py', line {k}" for k in range(100)))

    monkeypatch.setattr(setup.kept_engines, "keep_for_next_run", fails)
    console = Console(record=True, width=200)
    run = SimpleNamespace(built=SimpleNamespace(engines=[object()], learners=[]),
                          services=SimpleNamespace(waiter=SimpleNamespace(get=None), console=console),
                          cfg=SimpleNamespace(engine=SimpleNamespace(keep_warm_s=300)))
    assert setup._keep_engines(run) is False
    said = [ln for ln in console.export_text().splitlines() if ln.strip()]
    assert len(said) == 1 and said[0].startswith("note: the engines were not kept warm (RunError: keeping"), said
    assert said[0].endswith("the next run starts them afresh.") and "File" not in said[0]
