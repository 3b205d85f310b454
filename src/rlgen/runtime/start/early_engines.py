"""Engines asked for while their model folder is still being built.

A preset's random model folder takes seconds to build (imports, the random init, writing it), and an engine's start
begins with seconds that need no folder: its process, its kind's imports (vLLM's: 8-10 s on a GPU host). So where
the driver builds the folder and the engines run on its own node, set-up asks for the engines as soon as the
cluster is up. Each engine's constructor first does what its kind can do without the folder (the kind's
``before_model_folder``, in its package ``rlgen.engines.<kind>``; vLLM imports itself there), then waits for the
folder to appear and starts as it always does. The folder appears whole: prepare_model renames the finished build
into place. The engine class itself is unchanged: this is a mixin put before it."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rlgen.engines.registry import EngineSpec
from rlgen.models.build import build_folder

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from rlgen.runtime.cluster.actors import ActorFactory
    from rlgen.runtime.run_handle import Run
    from rlgen.runtime.start.on_thread import Beside

log = logging.getLogger(__name__)

FOLDER_POLL_S = 0.05
FOLDER_WAIT = "wait for the model folder"

BeforeFolder = Callable[[dict[str, str] | None], str | None]  # (the engine's env) -> the name of its step, or None


class AfterFolder:
    """Put before an engine class (after_folder): the constructor runs ``before_folder`` (with the engine's env
    argument), waits up to ``folder_wait_s`` for ``model_path`` to exist, then is the engine's own constructor. Its
    first health report counts those steps in the engine's start."""

    before_folder: ClassVar[BeforeFolder | None] = None
    folder_wait_s: ClassVar[float] = 900.0

    def __init__(self, model_path: str, *args: Any, **kwargs: Any):
        began = time.time()
        hook = type(self).before_folder
        step = hook(kwargs.get("env")) if hook is not None else None
        ready = time.time()
        while not os.path.isdir(model_path):
            if time.time() - ready > self.folder_wait_s:
                raise RuntimeError(f"the model folder {model_path} did not appear within {self.folder_wait_s:.0f} s "
                                   "of the engine's start (startup_timeout_s)")
            time.sleep(FOLDER_POLL_S)
        self._before_folder = (began, step, ready - began, time.time() - ready)
        super().__init__(model_path, *args, **kwargs)  # type: ignore[call-arg]
        self._first_clock = getattr(self, "clock", None)

    def health(self) -> dict[str, Any]:
        report = super().health()  # type: ignore[misc]
        clock = getattr(self, "clock", None)
        startup = report.get("startup") if isinstance(report, dict) else None
        if not isinstance(startup, dict) or clock is None or clock is not self._first_clock:
            return report  # a later start (a kept engine taken over) is timed by its own clock
        began, step, before_s, wait_s = self._before_folder
        steps: dict[str, float] = {step: before_s} if step else {}
        steps[FOLDER_WAIT] = wait_s
        for name, seconds in (startup.get("steps") or {}).items():
            steps[name] = steps.get(name, 0.0) + seconds
        return {**report, "startup": {**startup, "init_begin": began, "steps": steps}}


def after_folder(cls: type, before: BeforeFolder | None, wait_s: float) -> type:
    """``cls`` with AfterFolder before it: an actor class whose engine waits for its model folder."""
    return type(f"{cls.__name__}AfterFolder", (AfterFolder, cls),
                {"before_folder": staticmethod(before) if before is not None else None, "folder_wait_s": float(wait_s)})


def before_folder_hook(spec: EngineSpec) -> BeforeFolder | None:
    """The kind's ``before_model_folder`` (a function of its package, ``rlgen.engines.<kind>``), or None."""
    try:
        module = importlib.import_module(f"rlgen.engines.{spec.kind}")
    except ImportError:
        return None
    return getattr(module, "before_model_folder", None)


@dataclass
class EarlyEngines:
    """The engines asked for as soon as the cluster was up, while the model folder they load was still being
    built (runtime.start.early_engines): their processes and imports go on beside the build. ``path``: the folder
    they wait for; end_phase ends the engines' start-up phase, which began when they were asked for."""

    engines: list[ActorHandle]
    asked: dict[str, float]
    path: str
    end_phase: Callable[[], None]

    def hand_over(self, run: Run, asked: dict[str, float]) -> list[ActorHandle] | None:
        """The engines, once the folders are placed, where each waits for the path it would be given now; else
        None, with them stopped (set-up then asks for its engines as usual)."""
        built = run.built
        assert built.factory is not None
        given = [built.factory.engine_path(i, built.folders.engine_paths) for i in range(len(self.engines))]
        if built.start_model_path == self.path and all(p == self.path for p in given):
            asked.update(self.asked)
            return self.engines
        log.info("the engines asked for before the model folder wait for %s, but this run's engines load %s; "
                 "they are stopped and asked for again", self.path, given)
        self.stop()
        return None

    def stop(self) -> None:
        import ray

        for engine in self.engines:
            with contextlib.suppress(Exception):  # best effort: a cluster this run started goes whole anyway
                ray.kill(engine)


def engines_before_folder(run: Run, make_factory: Callable[[], ActorFactory], model: Beside[None],
                          phase: str) -> EarlyEngines | None:
    """The engines asked for now, while the model folder is still being built, so their start's first seconds (a
    process, the kind's imports: its ``before_model_folder``) go on beside the build; each waits for the folder,
    then starts as usual. None (they are asked for once the folder is there) for a kind with nothing to do
    before its folder, where the folder is there already or comes from a path or a checkpoint, on a cluster taken
    over, or where an engine runs on another node than this process (it reads a copy of the folder, made once
    the folder exists)."""
    import ray

    cfg, plan = run.cfg, run.plan
    before = before_folder_hook(plan.engine)
    if (before is None or model.finished() or cfg.model.path or run.built.resume is not None or run.built.taken_over
            or not plan.engines):
        return None
    path = build_folder(cfg, plan.device)
    here = ray.get_runtime_context().get_node_id()
    if path.is_dir() or any(run.built.node_ids[ap.group] != here for ap in run.built.placement.engines):
        return None
    end = run.services.clock.begin(phase) if run.services.clock else (lambda: None)
    run.built.factory = make_factory()
    cls = after_folder(run.built.factory.engine_cls, before, cfg.startup_timeout_s)
    asked: dict[str, float] = {}
    engines = []
    for i in range(len(plan.engines)):
        asked[run.built.engine_names[i]] = time.time()
        engines.append(run.built.factory.engine(i, str(path), run.state.version, cls=cls))
    return EarlyEngines(engines, asked, str(path), end)


__all__ = ["FOLDER_WAIT", "AfterFolder", "EarlyEngines", "after_folder", "before_folder_hook", "engines_before_folder"]
