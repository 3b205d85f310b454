"""On-policy distillation's teacher in the plan (algo.teacher, docs/algorithms.md section 11): what it is (a model
folder, such as a trained run's final_model, or a model preset built as the student's is), its shape and size, and
where it runs. It runs in the learners' reference slot: every learner rank holds a frozen copy in the learner's
half precision (float32 on CPU) and scores its own rows' sampled tokens before the update, a phase of its own on
the timeline (Phase.teacher). Each problem is one sentence. Pure: JSON and the presets' YAML, no torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from rlgen.config import DistillEstimator, ModelConfig, RunConfig
from rlgen.config.compose import compose_run_config, group_options
from rlgen.plan.model_folder import folder_model
from rlgen.plan.params import count_params

PLACE = "the learners' reference slot"  # where the teacher runs: a frozen copy on every learner rank


@dataclass(frozen=True)
class TeacherPlan:
    source: str  # algo.teacher as given: a folder, or a preset's name
    preset: bool  # a model preset, built (and cached) as a student of that preset would be
    model: ModelConfig  # its shape
    params: int

    def gib(self, bytes_per_param: int = 2) -> float:
        """Its weights on one learner rank, GiB."""
        return self.params * bytes_per_param / 2**30


_FOUND: dict[str, TeacherPlan] = {}  # each teacher read once a process: the plan's memory fit asks many times


def teacher_plan(cfg: RunConfig) -> TeacherPlan | None:
    """The teacher algo.teacher names (None: no distillation, or a folder without a readable config.json, which
    teacher_problems refuses). A folder's shape is read from its config.json alone, not the student's preset."""
    source = cfg.algo.teacher
    if not source:
        return None
    if source not in _FOUND:
        preset = source in group_options("model")
        model = compose_run_config([f"model={source}"]).model if preset else folder_model(source, ModelConfig())
        if model is None:
            return None  # not kept: the folder may be written later in this process
        _FOUND[source] = TeacherPlan(source, preset, model, count_params(model)[0])
    return _FOUND[source]


def teacher_problems(cfg: RunConfig, p: list[str]) -> None:
    """One sentence for each problem with the teacher: algo=distill without one, a teacher that is neither a
    preset nor a model folder, a mix outside [0, 1] or without a teacher. That it shares the student's tokenizer
    is checked at set-up, where both tokenizers are at hand (runtime.start.teacher): the embedding's rows do not
    say it (Qwen2.5's 7B has 152,064 of them and its 1.5B 151,936, over one tokenizer)."""
    a, presets = cfg.algo, group_options("model")
    if not 0.0 <= a.distill_coef <= 1.0:
        p.append(f"algo.distill_coef={a.distill_coef} must be in [0, 1]: the share of each token's advantage that is "
                 "the teacher's (1: distillation alone, 0.5: half the task's reward); for example "
                 "algo.distill_coef=1.")
    if not a.teacher:
        if a.distill_coef != 1.0 and a.kind != "distill":
            p.append(f"algo.distill_coef={a.distill_coef:g} has no effect without a teacher; drop it or set algo=distill "
                     "algo.teacher=<a model folder or preset>.")
        if DistillEstimator(a.distill_estimator) is not DistillEstimator.sampled and a.kind != "distill":
            p.append(f"algo.distill_estimator={a.distill_estimator} has no effect without a teacher; drop it or set "
                     "algo=distill algo.teacher=<a model folder or preset>.")
        if a.kind == "distill":
            p.append("algo=distill needs a teacher: set algo.teacher to a model folder with the student's tokenizer "
                     "(a trained run's final_model, e.g. algo.teacher=outputs/<run>/final_model) or to a model "
                     f"preset ({', '.join(presets)}).")
        return
    if teacher_plan(cfg) is None:
        folder = Path(a.teacher).expanduser()
        what = "has no readable config.json" if folder.is_dir() else "is not a folder"
        p.append(f"algo.teacher={a.teacher} is neither a model preset ({', '.join(presets)}) nor a model folder: it "
                 f"{what}; give a Hugging Face model folder (a trained run's final_model) or a preset's name.")


def frozen_bytes(cfg: RunConfig, params: int, lora: bool) -> int:
    """The frozen models on one learner rank, bytes in half precision: the KL reference (algo.kl_coef > 0; with
    LoRA it is the base with the adapters off, no copy) and the teacher (algo.teacher)."""
    teacher = teacher_plan(cfg) if cfg.algo.teacher else None
    reference = 2 * params if cfg.algo.kl_coef > 0 and not lora else 0
    return reference + (2 * teacher.params if teacher else 0)


def with_teacher(cfg: RunConfig) -> RunConfig:
    """cfg with algo.teacher as an absolute folder where it names one (actors on other nodes and a run started in
    another directory read the same folder); a preset's name stays."""
    t = cfg.algo.teacher
    if not t or t in group_options("model"):
        return cfg
    return dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, teacher=str(Path(t).expanduser().resolve())))


__all__ = ["PLACE", "TeacherPlan", "frozen_bytes", "teacher_plan", "teacher_problems", "with_teacher"]
