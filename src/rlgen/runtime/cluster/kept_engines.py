"""Engines kept warm between runs (``engine.keep_warm_s``; the engine side is the KeepsWarm capability).

A local run that ends well leaves its cluster and engines running, asleep, for keep_warm_s seconds; the next run
on this host whose cluster and engines would be built the same way, and whose workers would start as the
cluster's do (runtime.cluster.kept_fingerprint), takes them over and skips Ray's and vLLM's start. Another local
run stops the kept cluster first. What is kept is found by its keys: the cluster's (with its fingerprint) in the
session's marker, each engine's in its actor's name.
docs/startup.md has the whole life of a kept engine."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from rlgen.types import JSONDict

log = logging.getLogger(__name__)

NAMESPACE = "rlgen_warm"
PREFIX = "rlgen-warm"
CLAIM_MARGIN_S = 10.0  # a kept cluster this close to its end is not taken over (its head may be stopping it)
KEEP_TIMEOUT_S = 60.0  # for every engine to tidy up, reload its starting weights and sleep at the end of a run
ANSWER_S = 30.0  # for a kept engine to answer its health check when a run takes it over
NAME_FREE_S = 10.0  # for Ray to free the name of an engine that was killed, before its successor takes it


def _digest(obj: object) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()[:12]


def cluster_key(init: dict[str, int], groups: list[list[dict[str, float]]]) -> str:
    """What a kept cluster must match to be taken over: Ray's start arguments and the placement-group bundles."""
    return _digest({"init": init, "groups": groups})


def group_name(key: str, index: int) -> str:
    return f"{PREFIX}-{key}-pg{index}"


def engine_key(cls: type, args: Mapping[str, object]) -> str:
    """What a kept engine must match to be taken over: its class and every argument it was built with."""
    plain = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in args.items()}
    return _digest({"class": f"{cls.__module__}.{cls.__qualname__}", "args": plain})


def engine_name(name: str, key: str) -> str:
    return f"{PREFIX}-{name}-{key}"


def named_engines() -> list[str]:
    """The names of the detached engines in this cluster."""
    from ray.util import list_named_actors

    return [a["name"] for a in list_named_actors(all_namespaces=True) if a.get("namespace") == NAMESPACE]


def find_engine(name: str) -> ActorHandle | None:
    """The kept engine actor of that name, or None."""
    import ray

    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def drop_engines(keep: set[str]) -> list[str]:
    """Kill the kept engines not named in keep (another run's settings): their GPU memory goes to this run's."""
    import ray

    dropped = []
    for name in named_engines():
        if name not in keep:
            actor = find_engine(name)
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
                dropped.append(name)
    return dropped


def detached_options(name: str) -> dict[str, str]:
    return {"name": name, "namespace": NAMESPACE, "lifetime": "detached"}


def free_name(name: str, timeout_s: float = NAME_FREE_S) -> None:
    """Kill the actor holding name (an engine that died and is being re-created) and wait until Ray frees it."""
    import ray

    deadline = time.monotonic() + timeout_s
    while (actor := find_engine(name)) is not None and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        time.sleep(0.2)


def answering(actor: ActorHandle | None, timeout_s: float = ANSWER_S) -> ActorHandle | None:
    """The kept engine if it answers its health check in time and is well, else None (it is stopped)."""
    import ray

    if actor is None:
        return None
    try:
        if ray.get(actor.health.remote(), timeout=timeout_s).get("ok"):
            return actor
    except Exception as err:  # noqa: BLE001 - a kept engine that cannot answer is replaced by a new one
        log.info("a kept engine did not answer (%s); starting a new one", err)
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)
    return None


def keep_for_next_run(engines: Sequence[ActorHandle],
                      wait: Callable[[list[ObjectRef], str, float], list[JSONDict]]) -> list[JSONDict]:
    """Every engine (KeepsWarm) tidies up for the next run (nothing paused or queued, no adapters, the prefix cache
    dropped), loads its starting weights again where its kind can, and sleeps where its kind sleeps (level 1:
    take_over() wakes an engine that can generate at once). wait(refs, what, timeout_s) returns their answers."""
    return wait([e.keep_for_next_run.remote(1) for e in engines], "keeping the engines warm", KEEP_TIMEOUT_S)


__all__ = ["NAMESPACE", "answering", "cluster_key", "detached_options", "drop_engines", "engine_key", "engine_name", "find_engine",
           "free_name", "group_name", "keep_for_next_run", "named_engines"]
