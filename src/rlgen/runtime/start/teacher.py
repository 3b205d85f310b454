"""On-policy distillation's teacher at set-up: its folder (algo.teacher as given, or its preset built and cached as
a student of that preset would be) and the check that it shares the student's tokenizer, since it scores the
student's token ids."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlgen.config import RunConfig
from rlgen.models.build import load_tokenizer, prepare_model
from rlgen.plan.teacher import teacher_plan
from rlgen.runtime.errors import RunError


def teacher_folder(cfg: RunConfig, device: str) -> str | None:
    """The teacher's model folder: algo.teacher's folder, or its preset's build (made here where it is not cached,
    on device); None without a teacher."""
    plan = teacher_plan(cfg)
    if plan is None:
        return None
    if not plan.preset:
        return plan.source
    return prepare_model(dataclasses.replace(cfg, model=plan.model), device=device)


def check_teacher_tokenizer(name: str, path: str, student: Any) -> None:
    """Raises RunError, in one sentence, where the teacher's tokenizer maps tokens to other ids than the student's."""
    vocab, theirs = student.get_vocab(), load_tokenizer(path).get_vocab()
    if vocab == theirs:
        return
    differ = sum(1 for tok, i in vocab.items() if theirs.get(tok) != i) + len(set(theirs) - set(vocab))
    raise RunError(f"algo.teacher={name} does not share the student's tokenizer ({differ} of its {len(theirs)} tokens "
                   f"have another id or none in the student's {len(vocab)}): a teacher scores the student's token ids, "
                   "so give a teacher of the student's family, built with its tokenizer.")


__all__ = ["check_teacher_tokenizer", "teacher_folder"]
