"""Engine kinds by name: what the plan, the runtime, `rlgen serve`, `rlgen bench` and `rlgen validate` know of an
engine is its ``EngineSpec``, never its name.

A kind is found in one of two places:
- registered in this process with ``register_engine(spec)`` (an engine of your own, or a test's stand-in);
- ``rlgen.engines.<kind>``, a module or package whose ``ENGINE`` is the spec (hf, vllm and remote live there).

A new engine kind is a folder under ``engines/`` (its spec and its actor class, which implements the protocols of
``rlgen.engines.contract`` its flags claim) plus its preset in ``conf/engine/``. A spec module imports no torch,
vllm or Ray: the plan reads specs without them; ``spec.actor_class()`` imports the actor where one is made.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlgen.config import RunConfig, Setting, Transport


class UnknownEngineKind(LookupError):
    """engine.kind names no registered kind and no module of rlgen.engines with an ENGINE spec."""


@dataclass(frozen=True)
class EngineSpec:
    """One engine kind: its actor class and what it can do. Every flag answers a question the plan or the
    runtime would otherwise answer by comparing kind names."""

    kind: str
    actor: str  # "package.module:Class" of the Ray actor; it implements what the flags claim (engines.contract)
    # what one of its engines does while it starts, said while the run waits for it ("" : "a <kind> engine starts")
    starting: str = ""
    devices: tuple[str, ...] = ("cpu", "cuda")  # where its engines can run
    package: str | None = None  # the pip package its actor imports, checked before a run starts
    tensor_parallel: bool = False  # one engine can shard over several GPUs (engine.tensor_parallel_size)
    memory_share: bool = False  # takes a share of its GPU's memory (engine.gpu_memory_utilization), which the plan
    #                             sizes, and may split a GPU with other engines (engine.engines_per_gpu)
    default_memory_share: float | None = None  # its own share when alone on its GPUs
    sleeps: bool = False  # sleep()/wake() free and refill the GPU: can sit beside colocated learners while they train
    in_flight_updates: bool = False  # PausesInFlight, pause()/resume(), and weight updates while generating:
    #                                  generation overlaps training by default on GPUs (algo.async_steps=1)
    receives_nccl: bool = False  # ReceivesNccl: init_weight_transfer()/receive_weights(), weights over NCCL
    receives_ipc: bool = False  # ReceivesIpc: init_weight_transfer({})/receive_ipc(), weights over CUDA IPC (colocated)
    cuts_short: bool = False  # CutsShort, generate_some(): a call ends once enough groups are done, the rest cut
    # short with their tokens so far (algo.partial_rollouts)
    threaded: bool = False  # the actor answers calls while generate() runs (pause, weights in flight)
    passes_env: bool = False  # engine.env reaches its processes
    served: bool = False  # its engines belong to a running `rlgen serve`: a run starts one small proxy per engine
    #                       (a kind that is not served is Servable: `rlgen serve` runs it)
    reference: bool = False  # the engine `rlgen validate` compares every other engine with (it claims scores too)
    adapters: bool = False  # PolicyAdapters (and NamedAdapters unless served): holds the base model and takes
    #                         LoRA adapters: each policy version (learner.lora.sync=adapter) and, under `rlgen serve`,
    #                         named ones
    keeps_warm: bool = False  # KeepsWarm, keep_for_next_run()/take_over(): its engines can outlive a run for the next
    #                           one (engine.keep_warm_s)
    scores: bool = False  # ScoresTokens, score(): teacher-forced logprobs of given tokens; a reference kind claims it
    shuts_down: bool = False  # ShutsDown, shutdown(): stops processes of its own that hold the GPU before the actor
    #                           is killed
    episodes: bool = False  # Episodic (rlgen.engines.episodes): generate() plays requests with an EpisodeSpec as
    #                         multi-turn episodes against their environment (task.kind=env)
    adapter_room: bool = False  # sets room for adapters aside at start, up to engine.max_lora_rank: a server takes
    #                             adapters only when that is set
    # The weight path to it: (colocated with the learners, the config) -> Transport.
    transport: Callable[[bool, RunConfig], Transport] = lambda colocated, cfg: Transport.ray_object_store
    # Extra constructor arguments of its actor: (the config, the transport, the engine env) -> kwargs.
    actor_kwargs: Callable[[RunConfig, Transport, dict[str, str]], dict[str, Any]] = field(
        default=lambda cfg, transport, env: {})
    # The plan's hook for what only the engine can resolve (a server's engines, TP size and lengths):
    # (config, parameters, vocabulary, problems) -> (config, settings). None: nothing to resolve.
    resolve: Callable[[RunConfig, int, int, list[str]], tuple[RunConfig, list[Setting]]] | None = None
    # Work for the engines that can begin on the launching host before they are asked for (filling a cache they
    # read at start): (the model's architectures, the engines' environment) -> None. None: nothing to begin.
    ahead: Callable[[list[str], dict[str, str]], None] | None = None

    @property
    def start_words(self) -> str:
        """What one of its engines does while it starts, in words."""
        return self.starting or f"a {self.kind} engine starts"

    def runs_on(self, device: str) -> bool:
        return device in self.devices

    def actor_class(self) -> type:
        """The actor class (imports its module: torch, vllm ...)."""
        module, _, name = self.actor.partition(":")
        return getattr(importlib.import_module(module), name)


_REGISTERED: dict[str, EngineSpec] = {}


def register_engine(spec: EngineSpec) -> EngineSpec:
    """Make ``spec.kind`` a kind every command knows, in this process (Ray actors get the class itself)."""
    _REGISTERED[spec.kind] = spec
    return spec


def unregister_engine(kind: str) -> None:
    _REGISTERED.pop(kind, None)


def engine_spec(kind: str) -> EngineSpec:
    """The spec of an engine kind; raises UnknownEngineKind with the kinds there are."""
    kind = str(kind)
    if kind in _REGISTERED:
        return _REGISTERED[kind]
    spec = None
    if kind.isidentifier() and importlib.util.find_spec(f"{__package__}.{kind}") is not None:
        spec = getattr(importlib.import_module(f"{__package__}.{kind}"), "ENGINE", None)
    if not isinstance(spec, EngineSpec) or spec.kind != kind:
        raise UnknownEngineKind(f"engine.kind={kind} is not an engine kind; choose one of: {', '.join(engine_kinds())} "
                                "(or register your own with rlgen.engines.registry.register_engine).")
    return spec


def engine_kinds() -> list[str]:
    """Every kind: the registered ones and rlgen.engines' packages (each a built-in kind)."""
    import rlgen.engines as pkg

    return sorted(set(_REGISTERED) | {m.name for m in pkgutil.iter_modules(pkg.__path__) if m.ispkg})


__all__ = ["EngineSpec", "UnknownEngineKind", "engine_kinds", "engine_spec", "register_engine", "unregister_engine"]
