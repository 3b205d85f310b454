"""task.long_prompts decides what happens to a very long prompt: under skip and truncate no character cap refuses
it first (the run leaves the row out, or cuts it to task.max_prompt_tokens), under reject it is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlgen.config.compose import compose_run_config
from rlgen.plan.preflight import preflight
from rlgen.tasks import build_task
from rlgen.tasks.prompts import PromptRenderer

pytest.importorskip("transformers")

LONG = "1+" * 5000 + "1="  # 10,002 characters: past the character cap of the default task.max_prompt_tokens=64


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    lines = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(1, 9)] + [{"prompt": LONG, "answer": "5001"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def _cfg(rows: Path, policy: str):
    return compose_run_config(["task=jsonl", f"task.path={rows}", f"task.long_prompts={policy}"])


@pytest.mark.parametrize("policy", ["skip", "truncate"])
def test_the_long_prompt_policy_decides_not_a_character_cap(rows, policy):
    assert len(LONG) == 10_002
    assert preflight(_cfg(rows, policy), machine=False).problems == []


def test_reject_still_refuses_the_long_prompt(rows):
    [problem] = preflight(_cfg(rows, "reject"), machine=False).problems
    assert problem.startswith("rows.jsonl:9: the prompt is 10,002 characters long, far more than "
                              "task.max_prompt_tokens=64 tokens hold;")
    assert "task.long_prompts=skip" in problem and "task.long_prompts=reject" not in problem


def test_the_run_leaves_the_row_out_or_cuts_it(rows):
    from rlgen.models import build_tokenizer

    tok = build_tokenizer()
    skip = _cfg(rows, "skip").task
    task, renderer = build_task(skip), PromptRenderer(tok, skip)
    assert task.keep_rows(lambda p: renderer.fits(p.text)) == 1  # as the run's loader does (task.long_prompts=skip)
    assert LONG not in [p.text for p in task.rows + task.eval_prompts()]
    cut = PromptRenderer(tok, _cfg(rows, "truncate").task)
    kept = cut.fit(cut.ids(LONG))
    assert kept is not None and len(kept) == 64 and kept == cut.ids(LONG)[-64:]
