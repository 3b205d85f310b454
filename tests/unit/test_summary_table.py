"""The run summary the terminal shows at the end: a short table, rounded, with units, whose paths are whole;
summary.json keeps every number."""

from __future__ import annotations

import io
import json
import re

from rich.console import Console

from rlgen.config.compose import compose_run_config
from rlgen.metrics.sink import MetricsSink


def closing_summary(out_dir) -> dict:
    """A finished default CPU run's summary.json, as the sink, the run and the balance write it."""
    return {
        "steps": 150, "wall_s": 35.53031611442566, "reward_first_20pct": 0.3873697916666667,
        "reward_last_20pct": 0.6692057291666667, "reward_gain": 0.28183593749999997,
        "tokens_per_s": 22354.054314648532, "step_s": 0.23418696562449137, "generate_s": 0.07354105472564697,
        "train_s": 0.09951342582702637, "wait_s": 0.08212114493052165, "sync_s": 0.007004949251810709,
        "sync_pause_s": 0.0006717379887898763, "max_staleness": 0, "skipped_steps": 0, "engine_restarts": 0,
        "eval/pass@1": 0.41666666666666663, "eval/prompts": 8, "final_version": 150, "model_path": str(out_dir / "final_model"),
        "initial_model_path": "/home/someone/.cache/rlgen/models/tiny-c3f77d69e037",
        "checkpoint_path": str(out_dir / "checkpoints" / "step_000150"),
        "checkpoint_seconds": [0.039142608642578125, 0.025565147399902344, 0.049308061599731445],
        "sync_warmup_s": 0.0, "setup_s": 21.304846048355103, "first_rollout_s": 22.224379301071167,
        "startup": {"phases": {"Ray cluster": 9.1}, "began": {"Ray cluster": 0.8}, "actors": {},
                    "first_rollout_s": 22.2},
        "balance_tokens_per_s_end_to_end": 6286.974962796926, "balance_steps": 150, "balance_kind": "training_bound",
        "balance_ratio": 0.46917074083026483, "balance_learner_wait_frac": 0.3413073357041768,
        "balance_engine_idle_frac": 0.6764739902747033, "balance_gen_tokens_per_s": 23186.196045397453,
        "balance_required_tokens_per_s": 10878.28477565488, "balance_sync_s": 0.005429744720458984,
        "balance_step_s": 0.21024322509765625, "balance_advice": "training-bound: speed up the learner.",
    }


def test_the_closing_run_summary_is_short_rounded_and_whole(tmp_path):
    out_dir = tmp_path / "outputs" / "2026-11-26" / "13-18-04-a-run-directory-with-a-long-name"
    summary = closing_summary(out_dir)
    shown = io.StringIO()
    sink = MetricsSink(out_dir, compose_run_config(["progress=false"]), 150, Console(file=shown, width=80))
    sink.close(summary)
    text = shown.getvalue()
    body = [line for line in text.splitlines() if line.startswith("│")]
    rows = [line for line in body if line.split("│")[1].strip()]  # a row's further lines leave this cell empty
    assert 5 <= len(rows) <= 15, text  # one screen, with the balance and start-up tables after it
    assert len(text.splitlines()) <= 20, text
    assert not re.search(r"\de[+-]\d", text), text  # no 2.235e+04
    assert "[0." not in text and "…" not in text, text  # no list of floats, no path cut short
    for piece in ("150 in 35.5 s", "0.387 -> 0.669 (+0.282)", "0 (on-policy)", "0 steps skipped", "pass@1 ",
                  "0.417", "held-out prompts │ 8 ", "3, 0.039 s each"):
        assert piece in text, text
    assert "balance_" not in text and "tokens" not in text and "Ray cluster" not in text  # their own tables
    unfolded = "".join(line.split("│")[2].strip() for line in body)  # a long path folds over lines, whole
    assert str(out_dir / "final_model") in unfolded and str(out_dir) in unfolded
    assert json.loads((out_dir / "summary.json").read_text()) == summary  # every number, in full
