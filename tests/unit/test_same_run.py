"""Two runs compared number by number (benchmarks/same_run.py) and the batch digests every step records
(rlgen.runtime.step.line.batch_digest): clock readings aside, one number that differs is named with its step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import load_benchmark
from rlgen.runtime.step.line import batch_digest
from rlgen.types import RolloutBatch


@pytest.fixture(scope="module")
def sr():
    return load_benchmark("same_run")


def _run(path: Path, lines: list[dict]) -> Path:
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _line(step: int, loss: float, t: float) -> dict:
    return {"step": step, "loss": loss, "digest/tokens": 7 + step, "digest/engine_logprobs": 11 + step,
            "step_s": t, "train_s": t / 2, "t_end": 100 + t, "tokens_per_s": 1 / t, "sync_weights_s_max": t,
            "timeline": [["learner0", "train", 0, t]], "balance": {"verdict": "x"}, "entropy": float("nan")}


def test_runs_that_differ_only_on_the_clock_are_identical(sr, tmp_path):
    a = _run(tmp_path / "a", [_line(0, 0.5, 1.0), _line(1, 0.25, 2.0)])
    b = _run(tmp_path / "b", [_line(0, 0.5, 3.0), _line(1, 0.25, 5.0)])
    rep = sr.compare(a, b)
    assert rep["identical"] and rep["digests_equal"] and not rep["differ"]
    assert rep["compared"] == 5  # step, loss, the two digests, entropy (NaN in both counts as equal)


def test_a_number_that_differs_is_named_with_its_first_step(sr, tmp_path):
    a = _run(tmp_path / "a", [_line(0, 0.5, 1.0), _line(1, 0.25, 1.0), _line(2, 0.125, 1.0)])
    later = _line(2, 0.125, 1.0) | {"digest/tokens": 99}
    b = _run(tmp_path / "b", [_line(0, 0.5, 1.0), _line(1, 0.2500001, 1.0), later])
    rep = sr.compare(a, b)
    assert not rep["identical"] and not rep["digests_equal"]
    assert rep["differ"]["loss"]["first_step"] == 1 and rep["differ"]["digest/tokens"]["first_step"] == 2
    assert rep["equal"] == rep["compared"] - 2
    short = _run(tmp_path / "c", [_line(0, 0.5, 1.0)])
    assert not sr.compare(a, short)["identical"]  # fewer steps is not the same run


def _batch(logp: torch.Tensor, ids: torch.Tensor) -> RolloutBatch:
    rows, length = logp.shape
    return RolloutBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.ones(rows, length),
                        engine_logprobs=logp, rewards=torch.zeros(rows), advantages=torch.zeros(rows),
                        group_ids=torch.arange(rows), version=0, prompt_len=ids.shape[1] - length)


def test_the_digest_moves_with_any_token_or_logprob_and_only_with_them():
    g = torch.Generator().manual_seed(0)
    logp, ids = -torch.rand(4, 6, generator=g), torch.randint(0, 50, (4, 9), generator=g)
    d = batch_digest(_batch(logp, ids))
    assert d == batch_digest(_batch(logp.clone(), ids.clone()))
    nudged = logp.clone()
    nudged[2, 3] = torch.nextafter(nudged[2, 3], torch.tensor(0.0))  # one float32 step
    assert batch_digest(_batch(nudged, ids))["digest/engine_logprobs"] != d["digest/engine_logprobs"]
    assert batch_digest(_batch(nudged, ids))["digest/tokens"] == d["digest/tokens"]
    other = ids.clone()
    other[1, 8] += 1
    assert batch_digest(_batch(logp, other))["digest/tokens"] != d["digest/tokens"]
    assert all(0 <= v < 2**32 for v in d.values())  # exact in JSON
