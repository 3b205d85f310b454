"""The token-level batch (rlgen.learners.token_batch): the driver packs each data rank's rows once
(runtime.step.shards), and a learner that trains it as sent makes exactly the step it makes when it packs a
padded RolloutBatch itself; the mesh's ranks get their data rank's batch, padded for the degree; bad batches are
refused."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch
from test_packed_learner import N, P, algo_of, near_trainer, random_batch

from helpers import tiny_qwen2, tokens_for
from rlgen.config import MonitorConfig
from rlgen.learners.packed import row_tokens
from rlgen.learners.token_batch import token_batch
from rlgen.learners.torch import TorchLearner
from rlgen.mesh import LearnerMesh
from rlgen.microbatches import assign
from rlgen.runtime.cluster.learner_group import LearnerGroup
from rlgen.runtime.step.shards import shards, with_advantages


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_qwen2(0).save_pretrained(path)
    return str(path)


def _assignment(batch, ranks: int, budget: int):
    return assign(row_tokens(batch.attention_mask, batch.response_mask, batch.prompt_len), ranks, budget)


@pytest.mark.parametrize(("preset", "values"), [("grpo", {}), ("grpo", {"old_logprobs": "trainer"}),
                                                ("dr_grpo", {"seq_mask_cap": 1.2}), ("cispo", {})])
@pytest.mark.parametrize("holes", [False, True], ids=["turns", "episodes"])
def test_the_drivers_token_batch_trains_what_the_learners_own_packing_trains(model_dir, preset, values, holes):
    batch = near_trainer(tiny_qwen2(0), random_batch(3, holes), 5)
    algo = algo_of(preset, **values, micro_batch_tokens=tokens_for(batch, 3))
    own, sent = (TorchLearner(model_dir, algo, MonitorConfig()) for _ in range(2))
    assignment = _assignment(batch, 1, algo.micro_batch_tokens)
    padded = batch.select(torch.tensor(assignment.rows(0)))  # the padded shard, with the driver's micro-batches
    padded.micro_rows = assignment.local(0)
    want = own.train_step(padded)  # the learner packs the padded rows itself
    (built,) = shards(batch, assignment, LearnerMesh())
    assert len(built.packs) > 1  # several micro-batches, as the driver chose them
    got = sent.train_step(pickle.loads(pickle.dumps(built)))  # as Ray sends it
    assert got.metrics == want.metrics and got.version == want.version == 1
    assert all(torch.equal(a, b) for a, b in zip(own.model.parameters(), sent.model.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(sent.model.parameters(), tiny_qwen2(0).parameters()))  # trained


def test_each_rank_gets_its_data_ranks_rows_packed_for_the_degree():
    batch = random_batch(4)
    mesh = LearnerMesh(data=2, sequence=2)
    assignment = _assignment(batch, 2, 0)
    data = shards(batch, assignment, mesh)
    assert len(data) == 2 and [b.n_rows for b in data] == [len(assignment.rows(d)) for d in range(2)]
    assert all(p.ids.shape[1] % 2 == 0 and p.sequence is None for b in data for p in b.packs)
    group = LearnerGroup(ranks=[object()] * 4, mesh=mesh, waiter=None, nodes=[], hang_s=1.0)
    sent = group.for_ranks(data)
    assert sent[0] is sent[1] is data[0] and sent[2] is sent[3] is data[1]
    assert group.leads(["a0", "a1", "b0", "b1"]) == ["a0", "b0"] and group.names == [f"learner{r}" for r in range(4)]
    batch.advantages = torch.arange(N, dtype=torch.float32)
    given = with_advantages(data, batch, assignment)
    for d, b in enumerate(given):
        assert b.advantages.tolist() == [float(r) for r in assignment.rows(d)]
        assert b.packs is data[d].packs  # packed once: the advantages come in beside the packs


def test_no_rectangle_of_prompt_and_response_reaches_a_learner():
    batch = random_batch(5)
    long = dataclasses.replace(batch, input_ids=torch.cat([batch.input_ids, torch.zeros(N, 500, dtype=torch.long)], 1),
                               attention_mask=torch.cat([batch.attention_mask, torch.zeros(N, 500, dtype=torch.long)], 1),
                               response_mask=torch.cat([batch.response_mask, torch.zeros(N, 500)], 1),
                               engine_logprobs=torch.cat([batch.engine_logprobs, torch.zeros(N, 500)], 1))
    built = token_batch(long, None, 0)  # the padded width 516 came from a row that is no longer here
    assert built.resp_len <= batch.response_mask.shape[1] and built.tokens == sum(row_tokens(
        batch.attention_mask, batch.response_mask, P))
    assert len(pickle.dumps(built)) < len(pickle.dumps(long)) / 3


def test_a_bad_batch_is_refused_in_a_sentence():
    batch = random_batch(6)
    with pytest.raises(ValueError, match="bad batch: input_ids"):
        token_batch(dataclasses.replace(batch, response_mask=batch.response_mask[:, :-1]))
    with pytest.raises(ValueError, match="do not take each of its 12 rows once"):
        token_batch(batch, [[0, 1], [1, 2]])
    built = token_batch(batch, None, 0, degree=2)
    with pytest.raises(ValueError, match="packed for sequence degree 2, trained at degree 1"):
        built.on(torch.device("cpu"))
    with pytest.raises(ValueError, match="advantages for 12 rows"):
        built.with_advantages(torch.zeros(3))
