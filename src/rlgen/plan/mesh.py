"""The learner mesh the plan builds (rlgen.mesh): learner.sequence_parallel checked against the ranks and the
model's heads, or, left null, chosen: the smallest degree at which a learner rank holds a micro-batch of the
run's longest row (1 on CPU, and wherever one rank holds it; the largest allowed where none does, which leaves
the most room to what the memory check says next)."""

from __future__ import annotations

from rlgen.config import RunConfig, Setting, set_key
from rlgen.engines.registry import EngineSpec
from rlgen.mesh import LearnerMesh, head_problem
from rlgen.plan.memory import longest_row_fits, longest_sequence


def _degrees(ranks: int, heads: int, kv_heads: int) -> list[int]:
    """The sequence degrees the ranks and heads allow, smallest first."""
    return [d for d in range(1, ranks + 1) if ranks % d == 0 and head_problem(d, heads, kv_heads) is None]


def resolve_mesh(cfg: RunConfig, spec: EngineSpec, model, ranks: int, colocated: bool,
                 p: list[str]) -> tuple[RunConfig, LearnerMesh, Setting | None]:
    """(the config with learner.sequence_parallel filled, the mesh, the setting to show); problems go to p.
    model: the plan's ModelSummary; ranks: the learner ranks placed (0 for a plan without learners)."""
    m, given = cfg.model, cfg.learner.sequence_parallel
    if ranks < 1:
        return cfg, LearnerMesh(), None
    if given is not None:
        if given < 1:
            p.append(f"learner.sequence_parallel={given} must be at least 1 (1: no sequence parallelism; left out, "
                     "the plan picks).")
            return cfg, LearnerMesh(data=ranks), None
        if ranks % given:
            fits = ", ".join(map(str, _degrees(ranks, m.num_heads, m.num_kv_heads)))
            p.append(f"learner.sequence_parallel={given} does not divide the plan's {ranks} learner rank(s); pick one "
                     f"of {fits}, or change the learner ranks (hardware.learner_ranks, or the learner GPUs).")
            return cfg, LearnerMesh(data=ranks), None
        if problem := head_problem(given, m.num_heads, m.num_kv_heads):
            p.append(problem)
            return cfg, LearnerMesh(data=ranks), None
        return cfg, LearnerMesh(ranks // given, given), Setting("learner.sequence_parallel", given, "config")
    degree, why = 1, "derived: one rank holds the longest row"
    if cfg.hardware.gpus_per_node == 0:
        why = "derived: CPU learners train whole rows"
    elif ranks > 1:
        degrees = _degrees(ranks, m.num_heads, m.num_kv_heads)
        fitting = [d for d in degrees
                   if longest_row_fits(set_key(cfg, "learner.sequence_parallel", d), spec, model, ranks, colocated)]
        degree = fitting[0] if fitting else degrees[-1]
        longest = longest_sequence(cfg)
        if degree > 1 and fitting:
            why = (f"derived: a learner rank holds the longest row ({longest} tokens) only as a slice of 1/{degree}; "
                   "the smallest such degree")
        elif degree > 1:
            why = (f"derived: no degree lets a learner rank hold the longest row ({longest} tokens); the largest the "
                   "ranks and heads allow")
    cfg = set_key(cfg, "learner.sequence_parallel", degree)
    return cfg, LearnerMesh(ranks // degree, degree), Setting("learner.sequence_parallel", degree, why)


__all__ = ["resolve_mesh"]
