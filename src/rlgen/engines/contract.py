"""The engine contract: the calls every engine answers (``Engine``) and one protocol per capability a kind claims
through its ``EngineSpec``, each protocol with its claim beside it (``capability``: the flags that claim it,
gathered in ``CAPABILITIES``).

The runtime, ``rlgen serve``, the learners' weight senders, ``rlgen validate`` and ``rlgen bench`` call engines
through these methods only, and a capability's methods only on kinds whose spec claims it. Where they are called,
engines are Ray actor handles (or validate's hosts), so no isinstance check can hold them to it: ``claims(spec)``
and ``require(spec, protocol, what)`` read the spec, and tests/unit/test_engine_contract.py checks every
registered kind's class against what its spec claims."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from rlgen.engines.registry import EngineSpec
from rlgen.generated import GenResult
from rlgen.types import GenRequest

TRANSFER_TIMEOUT_S = 300.0  # the protocols' default; a kind may default to its own

# Each capability, the flags that claim it (as people read them) and the test on a spec, in the order the
# protocols are defined: each protocol states its own claim (`capability`)
CAPABILITIES: list[tuple[type, str, Callable[[EngineSpec], bool]]] = []


def capability(flags: str, claimed: Callable[[EngineSpec], bool]) -> Callable[[type], type]:
    """Mark the protocol below as a capability that a kind claims where claimed(its spec) (flags: the EngineSpec
    flags that claim it, as a sentence names them)."""

    def register(protocol: type) -> type:
        CAPABILITIES.append((protocol, flags, claimed))
        return protocol

    return register


@runtime_checkable
class Engine(Protocol):
    """Every engine kind (no flag): generation, weights, memory and health."""

    def generate(self, requests: list[GenRequest], version: int | None = None) -> GenResult:
        """Token-in/token-out: n completions per request, in request order, the engine's spans and its policy
        version (rlgen.generated.GenResult)."""

    def update_weights(self, weights: Any, version: int) -> dict[str, Any]:
        """Load new policy weights (a name -> tensor mapping); returns {"version": int, "spans": [...]}."""

    def sleep(self, level: int = 1) -> None:
        """Give up accelerator memory until wake() (a no-op where there is none to give up)."""

    def wake(self, tags: list[str] | None = None) -> None:
        """Take back what sleep() gave up: all of it, or only the parts tagged ("weights", "kv_cache")."""

    def health(self) -> dict[str, Any]:
        """{"ok": bool, "name": str, "version": int, ...}; cheap, answers within a second."""


# a served kind's proxies pause the server, which holds new requests (and freezes running ones where it can)
@capability("in_flight_updates or served", lambda s: s.in_flight_updates or s.served)
@runtime_checkable
class PausesInFlight(Protocol):
    """Flag ``in_flight_updates`` (or ``served``): weights change while requests run, which wait meanwhile."""

    def pause(self, mode: str = "keep", clear_cache: bool = False) -> None:
        """Freeze the running requests (mode "keep": with their KV cache) until resume()."""

    def resume(self) -> None:
        """Let the frozen requests go on; new ones are taken again."""


@capability("receives_nccl or receives_ipc", lambda s: s.receives_nccl or s.receives_ipc)
@runtime_checkable
class JoinsWeightTransfer(Protocol):
    """Flag ``receives_nccl`` or ``receives_ipc``: the set-up both weight paths share."""

    def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float = TRANSFER_TIMEOUT_S) -> dict[str, Any]:
        """Join the learners' weight path: an NCCL group ({master_address, master_port, rank_offset, world_size})
        or, with {}, CUDA IPC."""


@capability("receives_nccl", lambda s: s.receives_nccl)
@runtime_checkable
class ReceivesNccl(JoinsWeightTransfer, Protocol):
    """Flag ``receives_nccl``: weights broadcast over NCCL by the learners' rank 0."""

    def receive_weights(self, update_info: dict[str, Any], version: int, timeout_s: float = TRANSFER_TIMEOUT_S, *,
                        pause: bool = False) -> dict[str, Any]:
        """Receive one whole update (names, dtypes, shapes in update_info) while rank 0 sends it; take version
        (pause: freeze running requests around it, flag ``in_flight_updates``)."""


@capability("receives_ipc", lambda s: s.receives_ipc)
@runtime_checkable
class ReceivesIpc(JoinsWeightTransfer, Protocol):
    """Flag ``receives_ipc``: weights from a learner on the same GPU, through a buffer shared over CUDA IPC."""

    def receive_ipc(self, handle: dict[str, Any], chunk: dict[str, Any], version: int, *, first: bool = True,
                    last: bool = True, pause: bool = False, timeout_s: float = TRANSFER_TIMEOUT_S) -> dict[str, Any]:
        """Load one chunk of the shared buffer; the last one takes version (pause: freeze requests around it)."""


@capability("adapters", lambda s: s.adapters)
@runtime_checkable
class PolicyAdapters(Protocol):
    """Flag ``adapters``: the engine keeps the base model and each policy version is a LoRA adapter."""

    def load_adapter(self, adapter: dict[str, Any], version: int, timeout_s: float | None = None) -> dict[str, Any]:
        """Make adapter ({"tensors", "config"}) the policy at version for requests that name no adapter."""


@capability("adapters and not served", lambda s: s.adapters and not s.served)
@runtime_checkable
class NamedAdapters(Protocol):
    """Flag ``adapters`` on a kind `rlgen serve` runs (not ``served``): adapters loaded by name for its clients."""

    def add_adapter(self, name: str, path: str) -> dict[str, Any]:
        """Load the PEFT adapter folder at path under name, for the requests that name it."""

    def remove_adapter(self, name: str) -> dict[str, Any]:
        """Unload the adapter loaded under name."""


@capability("not served", lambda s: not s.served)
@runtime_checkable
class Servable(Protocol):
    """Not ``served``: a kind `rlgen serve` runs, which streams and drops its prefix cache on request."""

    def generate_stream(self, requests: list[GenRequest]) -> Iterator[dict[str, Any]]:
        """generate(), streamed: {"deltas": [...]} as tokens come, then {"final": generate()'s GenResult}."""

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix (computed under older weights); True when done."""


@capability("keeps_warm", lambda s: s.keeps_warm)
@runtime_checkable
class KeepsWarm(Protocol):
    """Flag ``keeps_warm``: an engine that outlives its run for the next one with the same settings."""

    def keep_for_next_run(self, sleep_level: int = 1) -> dict[str, Any]:
        """The run ends and the engine stays: tidy up, load its starting weights again, sleep where that frees
        memory. Returns {"name", "asleep", "start_weights"}."""

    def take_over(self, version: int) -> dict[str, Any]:
        """A new run takes the kept engine: wake it, take version; returns health() plus "start_weights"."""


@capability("scores", lambda s: s.scores)
@runtime_checkable
class ScoresTokens(Protocol):
    """Flag ``scores``: teacher-forced logprobs of given tokens (`rlgen validate`'s reference, and its
    "teacher-forced" row for a candidate that claims it)."""

    def score(self, prompt_ids: list[list[int]], token_ids: list[list[int]],
              temperature: float = 1.0) -> list[list[float]]:
        """The logprob of each of token_ids[i] after prompt_ids[i] and the tokens before it, the logits divided
        by temperature (> 0); one list per row."""


@capability("adapters and served", lambda s: s.adapters and s.served)
@runtime_checkable
class UsesNamedAdapter(Protocol):
    """Flags ``adapters`` and ``served``: a server's engine generates with an adapter the server loads by name,
    and the server's policy stays for its other clients (`rlgen validate` with a LoRA adapter)."""

    def use_named_adapter(self, path: str) -> str:
        """Have the server load the adapter folder at path under a name of this engine's own and generate with it
        from now on; returns the name."""

    def drop_named_adapter(self) -> None:
        """Unload the adapter use_named_adapter() loaded (nothing when there is none)."""


@capability("shuts_down", lambda s: s.shuts_down)
@runtime_checkable
class ShutsDown(Protocol):
    """Flag ``shuts_down``: processes of the engine's own (vLLM's engine core) hold its GPU until they stop."""

    def shutdown(self) -> None:
        """Stop them, so the GPU is free as soon as the actor is killed (`rlgen bench` measures that)."""


@capability("cuts_short", lambda s: s.cuts_short)
@runtime_checkable
class CutsShort(Protocol):
    """Flag ``cuts_short``: a generate() that ends once enough groups are done (algo.partial_rollouts)."""

    def generate_some(self, requests: list[GenRequest], enough: int, version: int | None = None) -> GenResult:
        """generate(), ended once ``enough`` groups (the requests that share a group_id) have every sample finished
        and every must_finish request is done; each sample still running ends with finish_reason "abort" and the
        tokens (and logprobs) it had. The same result as generate()."""


PROTOCOLS: tuple[type, ...] = (Engine, *(p for p, _, _ in CAPABILITIES))


class CapabilityMissing(RuntimeError):
    """A call of a capability the engine kind's spec does not claim."""


def claims(spec: EngineSpec) -> list[type]:
    """The protocols an engine kind's class must implement: Engine and every capability its spec claims."""
    return [Engine, *(p for p, _, has in CAPABILITIES if has(spec))]


def has(spec: EngineSpec, protocol: type) -> bool:
    """Whether the kind claims protocol."""
    return protocol in claims(spec)


def flag_of(protocol: type) -> str:
    """The spec flag(s) that claim a capability ("" for Engine, which every kind implements)."""
    return next((flag for p, flag, _ in CAPABILITIES if p is protocol), "")


def require(spec: EngineSpec, protocol: type, what: str) -> None:
    """Raise CapabilityMissing unless the kind claims protocol; what: the work that needs it."""
    if not has(spec, protocol):
        raise CapabilityMissing(f"{what} needs engines with {protocol.__name__} (EngineSpec {flag_of(protocol)}), "
                                f"and engine={spec.kind} does not claim it; pick an engine kind that does.")


def protocol_methods(protocol: type) -> list[str]:
    """The methods a protocol declares itself (not those of the protocols it extends)."""
    return [name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")]


def owner_of(method: str) -> type | None:
    """The one protocol that declares method, or None."""
    return next((p for p in PROTOCOLS if method in protocol_methods(p)), None)


__all__ = ["CAPABILITIES", "PROTOCOLS", "CapabilityMissing", "CutsShort", "Engine", "JoinsWeightTransfer", "KeepsWarm",
           "NamedAdapters", "PausesInFlight", "PolicyAdapters", "ReceivesIpc", "ReceivesNccl", "ScoresTokens",
           "Servable", "ShutsDown", "UsesNamedAdapter", "claims", "flag_of", "has", "owner_of", "protocol_methods",
           "require"]
