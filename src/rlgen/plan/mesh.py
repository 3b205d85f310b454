"""How the learner holds its longest row: the mesh the plan builds (rlgen.mesh), learner.sequence_parallel checked
against the ranks and the model's heads, whether each layer's MLP is tiled (learner.tiled_mlp) and whether the
activation checkpoints go to host memory (learner.offload_checkpoints). Left null, the cheapest way a learner
rank holds a micro-batch of the run's longest row (resolve_mesh): none of them on CPU, and wherever one rank holds
it; all of them, at the largest degree allowed, where nothing does, which leaves the most room to what the memory
check says next."""

from __future__ import annotations

from rlgen.config import LearnerKind, RunConfig, Setting, set_key
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


KEYS = ("learner.sequence_parallel", "learner.tiled_mlp", "learner.offload_checkpoints")


def _with(cfg: RunConfig, choice: tuple[int, bool, bool]) -> RunConfig:
    for key, value in zip(KEYS, choice):
        cfg = set_key(cfg, key, value)
    return cfg


def _ways(cfg: RunConfig, degrees: list[int], deepspeed: bool) -> list[tuple[int, bool, bool]]:
    """(degree, tiled, offloaded) in the order the plan tries them: for each degree, untiled then tiled; then,
    only where no degree holds the row that way, each degree with the checkpoints offloaded too (only where the
    DeepSpeed learner checkpoints). A tile's recompute costs less than a sequence group's all-to-alls over the GPUs'
    links, and those less than every layer's input over the host link and back, in host memory the ranks of a
    node share. The config's values are fixed."""
    lc = cfg.learner
    on_gpu = [(False, False), (True, False)]
    if lc.tiled_mlp is not None:
        on_gpu = [w for w in on_gpu if w[0] == lc.tiled_mlp]
    offloaded = [(True, True)] if deepspeed and lc.gradient_checkpointing and lc.tiled_mlp is not False else []
    if lc.offload_checkpoints is not None:
        tiles = dict.fromkeys(t for t, _ in on_gpu + offloaded)
        on_gpu, offloaded = [(t, lc.offload_checkpoints) for t in tiles], []
    return [(d, t, o) for d in degrees for t, o in on_gpu] + [(d, t, o) for d in degrees for t, o in offloaded]


def resolve_mesh(cfg: RunConfig, spec: EngineSpec, model, ranks: int, colocated: bool, learner_kind: LearnerKind,
                 p: list[str]) -> tuple[RunConfig, LearnerMesh, list[Setting]]:
    """(the config with learner.sequence_parallel, learner.tiled_mlp and learner.offload_checkpoints filled, the mesh, the settings to show);
    problems go to p. model: the plan's ModelSummary; ranks: the learner ranks placed (0: a plan without them).

    Left null, the three are chosen together, cheapest first (_ways): for each degree the ranks and heads allow,
    smallest first, the MLP untiled, then tiled; then each degree with the checkpoints offloaded too; the first
    whose rank holds a micro-batch of the longest row is taken."""
    m, lc = cfg.model, cfg.learner
    if ranks < 1:
        return cfg, LearnerMesh(), []
    gpus = cfg.hardware.gpus_per_node > 0
    deepspeed = learner_kind is LearnerKind.deepspeed
    if lc.sequence_parallel is not None:
        given = _given_degree(cfg, ranks, p)
        if given is None:
            return cfg, LearnerMesh(data=ranks), []
        degrees, why = [given], "config"
    else:
        degrees = _degrees(ranks, m.num_heads, m.num_kv_heads) if gpus else [1]
        why = "derived: one rank holds the longest row" if gpus else "derived: CPU learners train whole rows"
    ways = _ways(cfg, degrees, deepspeed)
    fitting = [w for w in ways if not gpus or longest_row_fits(_with(cfg, w), spec, model, ranks, colocated)]
    degree, tiled, offloaded = fitting[0] if fitting else ways[-1]  # none fits: the most room; the memory check
    longest = longest_sequence(cfg)
    if lc.sequence_parallel is None and degree > 1:
        why = (f"derived: a learner rank holds the longest row ({longest} tokens) only as a slice of 1/{degree}; the "
               "smallest such degree" if fitting else
               f"derived: no degree lets a learner rank hold the longest row ({longest} tokens); the largest the ranks "
               "and heads allow")
    settings = [Setting("learner.sequence_parallel", degree, why)]
    for key, given, value, what in (("learner.tiled_mlp", lc.tiled_mlp, tiled, "its MLPs tiled"),
                                    ("learner.offload_checkpoints", lc.offload_checkpoints, offloaded,
                                     "its activation checkpoints in host memory")):
        if given is not None:
            settings.append(Setting(key, given, "config"))
        elif value:
            settings.append(Setting(key, True, f"derived: a learner rank holds a micro-batch of the longest row "
                                               f"({longest} tokens) only with {what}"))
    if offloaded and not (deepspeed and lc.gradient_checkpointing):
        p.append("learner.offload_checkpoints=true keeps the gradient checkpoints in host memory, but this learner "
                 "makes none; set learner.gradient_checkpointing=true on the DeepSpeed learner, or leave it out.")
    return _with(cfg, (degree, tiled, offloaded)), LearnerMesh(ranks // degree, degree), settings


__all__ = ["resolve_mesh"]
