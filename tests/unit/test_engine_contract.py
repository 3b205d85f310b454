"""The engine contract (rlgen.engines.contract) holds: every registered engine kind's class has each method of every
protocol its EngineSpec claims, with a signature the callers can use, and every engine method the runtime, the
server, the commands, the learners, `rlgen validate` and `rlgen bench` call belongs to exactly one protocol."""

from __future__ import annotations

import ast
import inspect
import pkgutil
from pathlib import Path

import pytest

import rlgen
from rlgen.engines.contract import (
    PROTOCOLS,
    CapabilityMissing,
    Engine,
    KeepsWarm,
    PausesInFlight,
    ReceivesNccl,
    ScoresTokens,
    claims,
    owner_of,
    protocol_methods,
    require,
)
from rlgen.engines.registry import engine_kinds, engine_spec

SRC = Path(rlgen.__file__).parent
CALLERS = ["runtime", "serve", "learners", "sync", "commands", "validate", "bench"]  # the code that calls engines
LEARNER_CODE = ["learners", "sync/sender.py"]  # the learner actor's classes and the weight sender it mixes in

# The one actor in CALLERS that is no engine: bench/raw.py drives vLLM's own offline LLM (RawVLLM, the bench's
# baseline with no rlgen around it) in an actor of its own. It is no engine kind, so no spec claims anything for
# it. The methods called on it there that no protocol declares are named here, per file: each must be a method of
# that class and of no protocol, and is allowed in that file alone. The calls it shares with the engines
# (generate, and shutdown through bench/sides.py) are checked like any engine's: Engine, ShutsDown.
NOT_ENGINES = {"bench/raw.py": ("RawVLLM", {"ready"})}

# What each built-in kind claims: a flag taken off a spec (or added) shows here.
BUILT_IN = {
    "hf": {"Engine", "PolicyAdapters", "NamedAdapters", "Servable", "KeepsWarm", "ScoresTokens", "CutsShort"},
    "vllm": {"Engine", "PausesInFlight", "JoinsWeightTransfer", "ReceivesNccl", "ReceivesIpc", "PolicyAdapters",
             "NamedAdapters", "Servable", "KeepsWarm", "ShutsDown", "CutsShort"},
    "remote": {"Engine", "PausesInFlight", "JoinsWeightTransfer", "ReceivesNccl", "PolicyAdapters",
               "UsesNamedAdapter"},
}


def _incompatible(want: inspect.Signature, have: inspect.Signature) -> str | None:
    """Why a method with signature ``have`` cannot take every call ``want`` allows (None: it can). Both without self."""
    params = list(have.parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params) and any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    by_name = {p.name: p for p in params}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for i, w in enumerate(want.parameters.values()):
        h = by_name.get(w.name)
        if h is None:
            return f"has no parameter {w.name!r}"
        if w.kind is w.POSITIONAL_OR_KEYWORD and (h.kind is not h.POSITIONAL_OR_KEYWORD or positional.index(h) != i):
            return f"takes {w.name!r} elsewhere than as positional parameter {i}"
        if w.kind is w.KEYWORD_ONLY and h.kind not in (h.KEYWORD_ONLY, h.POSITIONAL_OR_KEYWORD):
            return f"does not take {w.name!r} by keyword"
        if w.default is not w.empty and h.default is h.empty:
            return f"needs {w.name!r}, which callers may leave out"
    extra = [p.name for p in params if p.name not in want.parameters and p.default is p.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return f"needs {extra} as well" if extra else None


def _without_self(fn: object) -> inspect.Signature:
    sig = inspect.signature(fn)
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def _breaches(cls: type, protocols: list[type]) -> list[str]:
    out = []
    for protocol in protocols:
        for name in protocol_methods(protocol):
            impl = inspect.getattr_static(cls, name, None)
            if impl is None or not callable(getattr(cls, name)):
                out.append(f"{cls.__name__} lacks {protocol.__name__}.{name}")
                continue
            why = _incompatible(_without_self(getattr(protocol, name)), _without_self(getattr(cls, name)))
            if why:
                out.append(f"{cls.__name__}.{name} {why} ({protocol.__name__})")
    return out


@pytest.mark.parametrize("kind", engine_kinds())
def test_each_kind_implements_what_its_spec_claims(kind):
    spec = engine_spec(kind)
    assert _breaches(spec.actor_class(), claims(spec)) == []


def _built_in_kinds() -> list[str]:
    import rlgen.engines as pkg

    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.ispkg)


@pytest.mark.parametrize("kind", _built_in_kinds())
def test_each_built_in_kind_claims_what_it_did(kind):
    assert kind in BUILT_IN, f"engine={kind} is new: write what it claims into BUILT_IN"
    assert {p.__name__ for p in claims(engine_spec(kind))} == BUILT_IN[kind]


@pytest.mark.parametrize("kind", engine_kinds())
def test_a_reference_kind_scores(kind):
    """`rlgen validate` scores the candidate's tokens on the reference."""
    spec = engine_spec(kind)
    assert not spec.reference or ScoresTokens in claims(spec)


def test_a_missing_or_mismatched_method_is_a_breach():
    class Half:
        def generate(self, requests, version=None): ...
        def update_weights(self, weights, version): ...
        def sleep(self, level): ...  # callers may leave level out
        def wake(self, tags=None): ...
        def health(self): ...
        def pause(self, mode="keep", clear_cache=False): ...

    assert _breaches(Half, [Engine, PausesInFlight]) == [
        "Half.sleep needs 'level', which callers may leave out (Engine)", "Half lacks PausesInFlight.resume"]


def test_each_method_belongs_to_one_protocol():
    names = [n for p in PROTOCOLS for n in protocol_methods(p)]
    assert len(names) == len(set(names)), names


def _called_names(tree: ast.AST) -> set[str]:
    """Method names called as actor methods (``x.name.remote(...)``, ``x.name.options(...).remote(...)``), by
    name through the serve pool (``pool.call(index, "name", ...)``) or through validate's engine hosts
    (``host.call("name", ...)``)."""
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        target = node.func.value
        if node.func.attr == "remote":
            options = isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute)
            if options and target.func.attr == "options":
                target = target.func.value
            if isinstance(target, ast.Attribute):
                out.add(target.attr)
        elif node.func.attr == "call":
            named = [a.value for a in node.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            out.update(named[:1])
    return out


def _trees(folders: list[str]) -> list[tuple[str, ast.AST]]:
    """Each Python file under the folders (or the file itself, where one names a file)."""
    files = [f for d in folders for f in ([SRC / d] if (SRC / d).is_file() else sorted((SRC / d).rglob("*.py")))]
    return [(str(f.relative_to(SRC)), ast.parse(f.read_text())) for f in files]


def _learner_methods() -> set[str]:
    return {f.name for _, tree in _trees(LEARNER_CODE) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
            for f in c.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}


def _class_methods(tree: ast.AST, cls: str) -> set[str]:
    return {f.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == cls
            for f in c.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_the_calls_on_no_engine_are_that_actors_own():
    trees = dict(_trees(CALLERS))
    for path, (cls, names) in NOT_ENGINES.items():
        assert names <= _class_methods(trees[path], cls), f"{path}: {cls} has no {names}"
        assert [n for n in names if owner_of(n) is not None] == [], "a protocol's method: check it as an engine's"
        assert names <= _called_names(trees[path]), f"{path} no longer calls {names}: take them off NOT_ENGINES"


def test_every_engine_call_belongs_to_a_protocol():
    learners, outside = _learner_methods(), []
    found: set[str] = set()
    for path, tree in _trees(CALLERS):
        not_engine = NOT_ENGINES.get(path, ("", set()))[1]
        for name in _called_names(tree):
            found.add(name)
            if owner_of(name) is None and name not in learners and name not in not_engine:
                outside.append(f"{path}: {name}")
    assert outside == [], "engine calls outside rlgen.engines.contract; add them to a protocol"
    # the scan sees the calls it is meant to see
    assert {"generate", "health", "pause", "receive_weights", "receive_ipc", "load_adapter", "add_adapter",
            "reset_prefix_cache", "generate_stream", "keep_for_next_run", "take_over", "score",
            "use_named_adapter", "drop_named_adapter", "update_weights", "shutdown"} <= found


def test_require_names_the_protocol_and_its_flag():
    require(engine_spec("vllm"), ReceivesNccl, "weights over NCCL")
    with pytest.raises(CapabilityMissing, match=r"ReceivesNccl \(EngineSpec receives_nccl\).*engine=hf"):
        require(engine_spec("hf"), ReceivesNccl, "weights over NCCL")
    with pytest.raises(CapabilityMissing, match="keeps_warm"):
        require(engine_spec("remote"), KeepsWarm, "keeping engines warm")
