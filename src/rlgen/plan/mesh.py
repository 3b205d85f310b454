"""How the learner holds its longest row: the mesh the plan builds (rlgen.mesh), learner.sequence_parallel checked
against the ranks and the model's heads, and whether each layer's MLP is tiled (learner.tiled_mlp). Left null,
the smallest degree (and untiled before tiled) at which a learner rank holds a micro-batch of the run's longest
row: 1 and untiled on CPU, and wherever one rank holds it; the largest allowed, tiled, where none does, which
leaves the most room to what the memory check says next."""

from __future__ import annotations

from rlgen.config import RunConfig, Setting, set_key
from rlgen.engines.registry import EngineSpec
from rlgen.mesh import LearnerMesh, head_problem
from rlgen.plan.memory import longest_row_fits, longest_sequence


def _degrees(ranks: int, heads: int, kv_heads: int) -> list[int]:
    """The sequence degrees the ranks and heads allow, smallest first."""
    return [d for d in range(1, ranks + 1) if ranks % d == 0 and head_problem(d, heads, kv_heads) is None]


def _given_degree(cfg: RunConfig, ranks: int, p: list[str]) -> int | None:
    """learner.sequence_parallel as given, checked (None, with the problem in p, where it cannot work)."""
    m, given = cfg.model, cfg.learner.sequence_parallel
    if given < 1:
        p.append(f"learner.sequence_parallel={given} must be at least 1 (1: no sequence parallelism; left out, the "
                 "plan picks).")
        return None
    if ranks % given:
        fits = ", ".join(map(str, _degrees(ranks, m.num_heads, m.num_kv_heads)))
        p.append(f"learner.sequence_parallel={given} does not divide the plan's {ranks} learner rank(s); pick one of "
                 f"{fits}, or change the learner ranks (hardware.learner_ranks, or the learner GPUs).")
        return None
    if problem := head_problem(given, m.num_heads, m.num_kv_heads):
        p.append(problem)
        return None
    return given


def _fits(cfg: RunConfig, spec: EngineSpec, model, ranks: int, colocated: bool, degree: int, tiled: bool) -> bool:
    cfg = set_key(set_key(cfg, "learner.sequence_parallel", degree), "learner.tiled_mlp", tiled)
    return longest_row_fits(cfg, spec, model, ranks, colocated)


def resolve_mesh(cfg: RunConfig, spec: EngineSpec, model, ranks: int, colocated: bool,
                 p: list[str]) -> tuple[RunConfig, LearnerMesh, list[Setting]]:
    """(the config with learner.sequence_parallel and learner.tiled_mlp filled, the mesh, the settings to show);
    problems go to p. model: the plan's ModelSummary; ranks: the learner ranks placed (0: a plan without them).

    Left null, the two are chosen together, cheapest first: for each degree the ranks and heads allow, smallest
    first, the MLP untiled and then tiled (a tile's recompute costs less than a sequence group's all-to-alls);
    the first pair whose rank holds a micro-batch of the longest row is taken."""
    m, lc = cfg.model, cfg.learner
    if ranks < 1:
        return cfg, LearnerMesh(), []
    gpus = cfg.hardware.gpus_per_node > 0
    if lc.sequence_parallel is not None:
        given = _given_degree(cfg, ranks, p)
        if given is None:
            return cfg, LearnerMesh(data=ranks), []
        degrees, why = [given], "config"
    else:
        degrees = _degrees(ranks, m.num_heads, m.num_kv_heads) if gpus else [1]
        why = "derived: one rank holds the longest row" if gpus else "derived: CPU learners train whole rows"
    tiles = [lc.tiled_mlp] if lc.tiled_mlp is not None else [False, True]
    pairs = [(d, t) for d in degrees for t in tiles]
    fitting = [(d, t) for d, t in pairs if not gpus or _fits(cfg, spec, model, ranks, colocated, d, t)]
    degree, tiled = fitting[0] if fitting else pairs[-1]  # none fits: the most room; the memory check says more
    longest = longest_sequence(cfg)
    if lc.sequence_parallel is None and degree > 1:
        why = (f"derived: a learner rank holds the longest row ({longest} tokens) only as a slice of 1/{degree}; the "
               "smallest such degree" if fitting else
               f"derived: no degree lets a learner rank hold the longest row ({longest} tokens); the largest the ranks "
               "and heads allow")
    settings = [Setting("learner.sequence_parallel", degree, why)]
    if lc.tiled_mlp is not None:
        settings.append(Setting("learner.tiled_mlp", tiled, "config"))
    elif tiled:
        settings.append(Setting("learner.tiled_mlp", True, f"derived: a learner rank holds a micro-batch of the longest "
                                                           f"row ({longest} tokens) only with its MLPs tiled"))
    cfg = set_key(set_key(cfg, "learner.sequence_parallel", degree), "learner.tiled_mlp", tiled)
    return cfg, LearnerMesh(ranks // degree, degree), settings


__all__ = ["resolve_mesh"]
