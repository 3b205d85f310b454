"""engine.tensor_parallel_size must shard every dimension vLLM splits: the attention heads, the KV heads (divided,
or copied when TP is a multiple of them), the MLP width and the padded vocabulary. The plan names each one that
does not split and the TP sizes that do."""

from __future__ import annotations

import pytest

from helpers import plan_problems
from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.plan.tensor_parallel import kv_groups, padded_vocab, tp_sizes, unsplit

QWEN_1_5B = compose_run_config(["model=qwen2_5_1_5b"]).model  # 12 heads, 2 KV heads, MLP 8,960, vocab 151,936


@pytest.mark.parametrize(("tp", "bad"), [
    (1, []), (2, []), (4, []),  # 4: each of the 2 KV heads copied onto 2 GPUs
    (3, ["model.intermediate_size", "model.vocab_size", "model.num_kv_heads"]),
    (6, ["model.intermediate_size", "model.vocab_size"]),  # 6 is a multiple of the 2 KV heads
    (8, ["model.num_heads"]),
])
def test_each_dimension_that_does_not_split_is_named(tp, bad):
    assert sorted(unsplit(QWEN_1_5B, tp)) == sorted(bad)


def test_the_vocabulary_is_split_as_vllm_pads_it():
    assert padded_vocab(151_936) == 151_936 and padded_vocab(151_900) == 151_936 and padded_vocab(100) == 128
    m = compose_run_config(["model=qwen2_5_1_5b", "model.vocab_size=151900"]).model
    assert "model.vocab_size" not in unsplit(m, 2)  # 151,900 rows do not divide by 64, but are padded to 151,936


def test_kv_heads_split_or_are_copied():
    assert [kv_groups(2, tp) for tp in (1, 2, 4, 8)] == [1, 2, 2, 2]
    assert [kv_groups(8, tp) for tp in (1, 2, 4, 8)] == [1, 2, 4, 8]


def test_tp3_on_four_gpus_is_refused_naming_the_dimensions_and_the_sizes_that_split():
    (problem,) = plan_problems(["engine=vllm", "engine.tensor_parallel_size=3", "hardware=4xh100",
                                "model=qwen2_5_1_5b"])
    assert problem == (
        "engine.tensor_parallel_size=3 does not shard model qwen2_5_1_5b: 3 must divide its MLP width 8,960 "
        "(model.intermediate_size) and its vocabulary of 151,936 rows (model.vocab_size; vLLM pads it to a multiple "
        "of 64), and must divide its 2 KV heads (model.num_kv_heads) or be a multiple of them; choose a TP size that "
        "does: 1, 2, 4 (up to a node's 4 GPUs).")
    assert tp_sizes(QWEN_1_5B, 4) == [1, 2, 4]


def test_tp4_over_two_kv_heads_is_planned():
    plan = build_plan(compose_run_config(["engine=vllm", "engine.tensor_parallel_size=4", "hardware=4xh100",
                                          "model=qwen2_5_1_5b", "hardware.colocated=true"]))
    assert plan.engines[0].tensor_parallel_size == 4
