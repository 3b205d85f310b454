"""A real workload on CPU with no hub: `rlgen train` on a model folder built here (BPE tokenizer with a chat
template, random Qwen2 weights) and GSM8K-shaped rows, through the task=gsm8k preset: chat prompts, the math
and format rewards scored in a worker pool, and held-out evaluation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlgen.metrics.sink import read_jsonl

pytest.importorskip("datasets")
pytest.importorskip("math_verify")


def test_train_on_a_model_folder_and_gsm8k_rows_with_eval(local_model, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rlgen.cli", "train", f"model.path={local_model / 'model'}", "task=gsm8k",
         f"task.path={local_model / 'train.jsonl'}", f"task.eval_path={local_model / 'test.jsonl'}",
         "eval.every=2", "eval.max_prompts=8", "steps=4", "algo.max_new_tokens=24", "engine.max_model_len=512",
         "algo.prompts_per_step=4", "task.reward_workers=2", "progress=false", f"hydra.run.dir={run}"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "task dataset: 260 rows, 40 held out; prompts as chat text" in (run / "run.log").read_text()
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(r["sequences"] == 4 * 8 for r in records)
    for r in records:  # each reward's mean is logged beside the weighted total
        assert r["reward_mean"] == pytest.approx(r["reward/math"] + 0.1 * r["reward/format"])
        assert r["reward/timeouts"] == 0
    evals = [r for r in records if "eval/pass@1" in r]
    assert [r["step"] for r in evals] == [1, 3] and all(r["eval/prompts"] == 8 for r in evals)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval/pass@1"] == evals[-1]["eval/pass@1"]
    assert (run / "final_model" / "chat_template.jinja").is_file()  # the folder's tokenizer went along
