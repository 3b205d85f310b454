"""Each token's policy version: a completion that lived through in-flight weight updates says which tokens came
after each one, the batch carries it per token, and the step record reports per-token staleness."""

from __future__ import annotations

import json

import torch

from rlgen.generated import completion_from_json, completion_to_json
from rlgen.runtime.rollouts.batch import build_batch
from rlgen.runtime.step.line import token_version_metrics
from rlgen.tasks.prompts import cut_at_stop
from rlgen.types import Completion


def comp(group: int, n: int, version: int, changes=()) -> Completion:
    return Completion(group, [5, 6], list(range(10, 10 + n)), [-0.5] * n, "length", version, list(changes))


def test_token_versions_follow_the_changes():
    assert comp(0, 4, 3).token_versions() == [3, 3, 3, 3]
    assert comp(0, 6, 3, [(2, 4), (5, 6)]).token_versions() == [3, 3, 4, 4, 4, 6]
    assert comp(0, 3, 3, [(0, 4)]).token_versions() == [4, 4, 4]


def test_batch_carries_each_tokens_version_and_the_record_its_staleness():
    comps = [comp(1, 4, 2, [(1, 3)]), comp(0, 2, 2), comp(0, 3, 1)]
    b = build_batch(comps, [1.0, 0.0, 1.0], pad_id=0)
    # rows sorted by group: the two group-0 completions first; padding stays 0
    assert b.token_versions.tolist() == [[2, 2, 0, 0], [1, 1, 1, 0], [2, 3, 3, 3]]
    assert b.select(torch.tensor([2])).token_versions.tolist() == [[2, 3, 3, 3]]
    m = token_version_metrics(b, learner_version=3)
    # learner at 3: staleness per token 1,1 | 2,2,2 | 1,0,0,0 over 9 tokens
    assert abs(m["token_staleness_mean"] - 9 / 9) < 1e-6
    assert abs(m["tokens_after_update_frac"] - 3 / 9) < 1e-6


def test_version_changes_survive_the_wire_the_flight_file_and_a_stop_cut():
    c = comp(0, 6, 3, [(2, 4), (5, 6)])
    assert completion_from_json(json.loads(json.dumps(completion_to_json(c)))) == c
    old = {k: v for k, v in completion_to_json(c).items() if k != "version_changes"}  # an older server's answer
    assert completion_from_json(old).version_changes == []
    saved = Completion(**json.loads(json.dumps(c.__dict__)))  # flights are written as JSON and read back
    assert saved.token_versions() == c.token_versions()
    class Chars:  # token i decodes to chr(i)
        @staticmethod
        def decode(ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    c = Completion(0, [5], [ord(x) for x in "abXYcd"], [-0.1] * 6, "length", 3, [(1, 4), (4, 5)])
    cut, text = cut_at_stop(c, Chars, ["XY"], "abXYcd")
    assert text == "abXY" and cut.token_versions() == [3, 4, 4, 4]  # the change after the cut is dropped
