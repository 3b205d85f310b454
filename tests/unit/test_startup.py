"""Start-up, timed: an actor's clock and vLLM's own log lines, a wait that says who it waits for, and the
report of the phases."""

from __future__ import annotations

import io
import time

from rich.console import Console

from rlgen.phases import ActorClock, process_start_time, read_log_times
from rlgen.runtime.cluster.waits import Waiter
from rlgen.runtime.signals import StopFlag
from rlgen.runtime.start.progress import StartupClock, print_startup

VLLM_LOG = [
    "Loading weights took 0.98 seconds",
    "Model loading took 7.6065 GiB memory and 1.163559 seconds",
    "torch.compile takes 30.74 s in total",
    "torch.compile took 4.64 s in total",
    "Available KV cache memory: 34.72 GiB",
    "Graph capturing finished in 8 secs, took 0.31 GiB",
    "init engine (profile, create kv cache, warmup model) took 33.27 seconds",
]


def test_vllm_log_lines_become_the_parts_of_an_engine_start():
    clock = ActorClock()
    text = "\n".join(f"(EngineCore pid=7) INFO 11-25 03:20:37 [x.py:1] {line}" for line in VLLM_LOG)
    read_log_times(clock, text + "\nunrelated line\n")
    assert clock.parts == {"weights": 1.163559, "torch.compile": 30.74 + 4.64, "CUDA graphs": 8.0,
                           "profile, KV cache, warm-up": 33.27}


def test_actor_clock_steps_follow_one_another():
    clock = ActorClock()
    time.sleep(0.05)
    clock.step("import")
    time.sleep(0.02)
    clock.step("weights")
    clock.done()
    d = clock.to_dict()
    assert d["steps"]["import"] >= 0.05 and d["steps"]["weights"] >= 0.02
    assert d["init_end"] - d["init_begin"] >= sum(d["steps"].values()) - 1e-6
    started = process_start_time()
    assert started is not None and started <= d["init_begin"]


def test_a_start_up_wait_says_who_it_is_waiting_for(monkeypatch, tmp_path):
    import ray

    t0 = time.time()
    ready_after = {"e": 0.0, "l": 0.6}

    def fake_wait(todo, num_returns, timeout):
        time.sleep(timeout)
        left = [r for r in todo if time.time() - t0 < ready_after[r]]
        return [r for r in todo if r not in left], left

    monkeypatch.setattr(ray, "wait", fake_wait)
    monkeypatch.setattr(ray, "get", lambda refs: list(refs))
    out = io.StringIO()
    clock = StartupClock(Console(file=out, width=200), launched=t0)
    said: list[list[int]] = []

    def progress(elapsed, pending):
        said.append(pending)
        clock.waiting(["engine0", "learner0"])(elapsed, pending)

    got = Waiter(10, StopFlag(), tmp_path).get(["e", "l"], "actor start-up", names=["engine0", "learner0"],
                                               progress=progress, every_s=0.2)
    assert got == ["e", "l"]
    assert said and said[-1] == [1]  # learner0 was the one still starting
    assert "waiting for learner0" in out.getvalue()


def test_the_waiting_line_says_what_the_engines_actually_started_do(tmp_path):
    # the CPU default starts hf engines and torch learners: the line describes those, not a vLLM engine's start
    from types import SimpleNamespace

    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan
    from rlgen.runtime.setup import _learner_words, _wait_actors

    plan = build_plan(compose_run_config([]))
    out = io.StringIO()

    class SaysAtOnce:
        def get(self, refs, what, timeout_s, names, progress):
            progress(16.0, list(range(len(refs))))
            return [{"name": n} for n in names]

    clock = StartupClock(Console(file=out, width=400), launched=time.time())
    run = SimpleNamespace(plan=plan, cfg=plan.config, services=SimpleNamespace(waiter=SaysAtOnce(), clock=clock))
    _wait_actors(run, ["e", "l"], ["engine0", "learner0"], {},
                 doing=[plan.engine.start_words, _learner_words(run)])
    line = out.getvalue()
    assert ("waiting for engine0, learner0 (16 s so far; an hf engine imports torch and transformers and loads the "
            "model's weights; a torch learner imports torch and transformers and builds the model and its "
            "optimizer)") in line
    assert "vLLM" not in line


def test_each_engine_kind_says_what_its_engines_do_while_they_start():
    from rlgen.engines.registry import EngineSpec, engine_spec

    assert "vLLM engine" in engine_spec("vllm").start_words and "CUDA graphs" in engine_spec("vllm").start_words
    assert engine_spec("hf").start_words.startswith("an hf engine") and "CUDA" not in engine_spec("hf").start_words
    assert "rlgen server" in engine_spec("remote").start_words
    assert EngineSpec(kind="mine", actor="x:Y").start_words == "a mine engine starts"


def test_the_report_lists_each_phase_and_actor():
    clock = StartupClock(Console(file=io.StringIO()), launched=time.time() - 5)
    with clock.phase("Ray cluster"):
        pass
    now = time.time()
    clock.actor({"name": "engine0", "startup": {"process_start": now - 3, "init_begin": now - 2, "init_end": now,
                                                "steps": {"import vllm": 0.5, "vLLM engine start": 1.5},
                                                "parts": {"torch.compile": 0.9}}}, launched_at=now - 2.5)
    clock.first_batch()
    d = clock.to_dict()
    assert list(d["phases"]) == ["launch to set-up (imports, config, plan)", "Ray cluster",
                                 "first batch (generate, score)"]
    assert d["actors"]["engine0"]["init_s"] == 2.0 and d["first_rollout_s"] >= 5
    out = io.StringIO()
    print_startup(d, Console(file=out, width=200))
    text = out.getvalue()
    for piece in ("Ray cluster", "engine0: import vllm 0.5, vLLM engine start 1.5; of which torch.compile 0.9",
                  "began 0.5 s after it was asked for", "time to first rollout"):
        assert piece in text


def test_phases_that_run_at_once_are_each_timed_in_the_order_they_began():
    from rlgen.runtime.start.on_thread import Beside

    clock = StartupClock(Console(file=io.StringIO()))
    t0 = time.time()
    model = Beside(time.sleep, 0.3, done=clock.begin("model folder and task"))
    with clock.phase("Ray cluster"):
        time.sleep(0.2)
    model.result(StopFlag())
    both = time.time() - t0
    phases = clock.to_dict()["phases"]
    assert list(phases)[1:] == ["model folder and task", "Ray cluster"]
    assert phases["model folder and task"] >= 0.3 and phases["Ray cluster"] >= 0.2
    assert both < 0.45  # at once, not one after the other (0.5 s)


def test_work_beside_set_up_raises_its_error_and_a_stop_does_not_wait_for_it():
    import pytest

    from rlgen.runtime.errors import StopRequested
    from rlgen.runtime.start.on_thread import Beside

    def bad() -> None:
        raise ValueError("model.path=/nowhere is not a model folder")

    done: list[bool] = []
    with pytest.raises(ValueError, match="not a model folder"):
        Beside(bad, done=lambda: done.append(True)).result(StopFlag())
    assert done == [True]  # its phase ended too
    stop = StopFlag()
    slow = Beside(time.sleep, 5)
    stop.request()
    t0 = time.time()
    with pytest.raises(StopRequested):
        slow.result(stop)
    assert time.time() - t0 < 1


def test_the_lines_said_as_phases_begin_and_the_report_use_one_clock():
    """A phase's live line says when it began (seconds after launch); the report has that same number in its
    "at" column and, beside it, the seconds the phase took."""
    import re

    live = io.StringIO()
    clock = StartupClock(Console(file=live, width=200), launched=time.time() - 5)
    with clock.phase("Ray cluster"):
        time.sleep(0.3)
    with clock.phase("engines and learners"):
        time.sleep(0.2)
    said = dict((name, float(at)) for at, name in re.findall(r"start-up (?:at )?\s*([\d.]+) s: (.+)", live.getvalue()))
    assert said["Ray cluster"] == 5.0 and said["engines and learners"] == 5.3
    out = io.StringIO()
    print_startup(clock.to_dict(), Console(file=out, width=200))
    rows = {cells[0]: cells[1:] for line in out.getvalue().replace("┃", "│").splitlines()
            if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) > 1}
    assert rows["Ray cluster"] == ["5.0", "0.3"] and rows["engines and learners"] == ["5.3", "0.2"]
    assert rows["phase"] == ["at", "took"]
