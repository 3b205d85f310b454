"""Algorithms by name (``algo.kind``): how a group's rewards become advantages, on the driver, and the policy
loss of a micro-batch, on the learner.

An algorithm is found in one of two places:
- registered in this process with ``register_algorithm(Algorithm(...))`` (your own, or a test's stand-in);
- ``rlgen.algo.<kind>``, a module whose top level defines ``ALGORITHM`` (grpo lives there).

So a new algorithm is one new file in ``algo/`` plus its preset in ``conf/algo/``, which holds its settings.
Whether a kind exists is read from the module's source, without importing it: the plan checks ``algo.kind`` on
machines without torch, and the functions are imported only where they run (``algorithm(kind)``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# advantages(rewards [N], group_ids [N], algo: AlgoConfig) -> advantages [N] float32
Advantages = Callable[..., Any]
# loss(logp [n, L], engine_logp [n, L], advantages [n], mask [n, L] bool, algo: AlgoConfig, denominator,
#      token_weight=None) ->
#   (loss [] with grad: the micro-batch's summed loss over `denominator`, metrics: dict of floats). mask is the
#   response mask; the learner's denominator leaves out what algo.seq_mask_cap drops, so a loss applies it too
#   (rlgen.algo.loss.sequence_keep). token_weight [n, L] (passed only with algo.entropy_top_frac < 1) multiplies
#   each token's term. Metrics it may report, each as a fraction or mean of its tokens: clip_frac, tis_frac,
#   seq_masked_frac, ratio_mean, ratio_max.
Loss = Callable[..., tuple[Any, dict[str, float]]]


class UnknownAlgorithm(LookupError):
    """algo.kind names no registered algorithm and no module of rlgen.algo that defines ALGORITHM."""


@dataclass(frozen=True)
class Algorithm:
    kind: str
    advantages: Advantages
    loss: Loss


_REGISTERED: dict[str, Algorithm] = {}


def register_algorithm(algo: Algorithm) -> Algorithm:
    """Make ``algo.kind`` an algorithm every command knows, in this process."""
    _REGISTERED[algo.kind] = algo
    return algo


def unregister_algorithm(kind: str) -> None:
    _REGISTERED.pop(kind, None)


def _defines_algorithm(path: str | None) -> bool:
    """Whether a module's source assigns ALGORITHM at its top level (read, not imported)."""
    if not path or not path.endswith(".py"):
        return False
    tree = ast.parse(Path(path).read_text())
    return any(isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
        isinstance(t, ast.Name) and t.id == "ALGORITHM" for t in (node.targets if isinstance(node, ast.Assign)
                                                               else [node.target])) for node in tree.body)


def algorithm_kinds() -> list[str]:
    """Every algorithm: the registered ones and the modules of rlgen.algo that define ALGORITHM."""
    import rlgen.algo as pkg

    found = {m.name for m in pkgutil.iter_modules(pkg.__path__)
             if _defines_algorithm(str(Path(pkg.__path__[0]) / f"{m.name}.py"))}
    return sorted(set(_REGISTERED) | found)


def algorithm_problem(kind: str) -> str | None:
    """Why algo.kind cannot be used, with the fix (None: it can). Imports nothing heavy."""
    kind = str(kind)
    if kind in _REGISTERED:
        return None
    spec = importlib.util.find_spec(f"{__package__}.{kind}") if kind.isidentifier() else None
    if spec is not None and _defines_algorithm(spec.origin):
        return None
    return (f"algo.kind={kind} is not an algorithm; choose one of: {', '.join(algorithm_kinds())} (each is a "
            "module of rlgen.algo, or register your own with rlgen.algo.registry.register_algorithm).")


def algorithm(kind: str) -> Algorithm:
    """The algorithm's functions (imports its module, and so torch)."""
    kind = str(kind)
    if kind in _REGISTERED:
        return _REGISTERED[kind]
    why = algorithm_problem(kind)
    if why:
        raise UnknownAlgorithm(why)
    found = importlib.import_module(f"{__package__}.{kind}").ALGORITHM
    if not isinstance(found, Algorithm):
        raise UnknownAlgorithm(f"rlgen.algo.{kind}.ALGORITHM is a {type(found).__name__}, not an Algorithm.")
    return found


__all__ = ["Algorithm", "UnknownAlgorithm", "algorithm", "algorithm_kinds", "algorithm_problem", "register_algorithm",
           "unregister_algorithm"]
