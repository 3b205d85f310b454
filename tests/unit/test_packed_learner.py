"""Packed micro-batches give the padded batch's loss and gradients, for every algorithm preset and loss option: the
packed path (rlgen.learners.packed, rlgen.learners.grpo_step, split into micro-batches by a token budget) against
a padded reference written here the way the learner computed it before packing (left-padded prompts, a dense
[N, P+L] forward with SDPA, full-vocabulary fp32 logits). CPU, fp32, random lengths with 1-token rows, rows at the
cap, rows whose loss mask is empty and episode masks with holes."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from helpers import tiny_qwen2, tokens_for
from rlgen.algo.inputs import LossInputs
from rlgen.algo.loss import aggregate, normaliser, rollout_keep, top_entropy_mask
from rlgen.algo.registry import configured_loss
from rlgen.config import LossAgg
from rlgen.config.compose import compose_run_config
from rlgen.learners.attention import use_packed_attention
from rlgen.learners.grpo_step import StepSums, micro_loss, token_kl, with_old_logprobs
from rlgen.learners.packed import kept_lengths, pack, packed_forward, row_tokens
from rlgen.learners.token_batch import token_batch
from rlgen.types import RolloutBatch

P, L, N, VOCAB = 6, 10, 12, 32
PRESETS = ("grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "cispo")


def random_batch(seed: int, holes: bool = False) -> RolloutBatch:
    """N rows: prompts of 1..P tokens left-padded, responses of 1..L tokens right-padded (rows 0 and 1 at the
    cap, row 2 one token, row 3 with an empty loss mask); with holes, environment tokens (mask 0) inside some
    responses, as an episode's."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (N, P + L), generator=g)
    attn = torch.zeros(N, P + L, dtype=torch.long)
    mask = torch.zeros(N, L)
    for i in range(N):
        p = int(torch.randint(1, P + 1, (1,), generator=g))
        r = L if i < 2 else 1 if i == 2 else int(torch.randint(1, L + 1, (1,), generator=g))
        ids[i, : P - p], ids[i, P + r:] = 0, 0
        attn[i, P - p: P + r] = 1
        mask[i, :r] = 1.0
        if holes and r > 3 and i % 2:
            mask[i, 1: r // 2] = 0.0
    mask[3] = 0.0
    adv = torch.randn(N, generator=g)
    engine = -torch.rand(N, L, generator=g) * 3 * mask  # replaced by near-trainer values below
    return RolloutBatch(input_ids=ids, attention_mask=attn, response_mask=mask, engine_logprobs=engine,
                        rewards=adv.clone(), advantages=adv, group_ids=torch.arange(N) // 4, version=0, prompt_len=P)


def padded_logits(model, ids: torch.Tensor, attn: torch.Tensor, temperature: float) -> torch.Tensor:
    """The learner's forward before packing: ids, attn [N, P+L] -> logits [N, L, V] fp32 predicting the
    responses, positions counting real tokens only."""
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=positions[:, :-1],
                logits_to_keep=L, use_cache=False)
    logits = out.logits.float()
    return logits / temperature if temperature > 0 and temperature != 1.0 else logits


def logp_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logz = torch.logsumexp(logits, -1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    return logp, logz - (logits.softmax(-1) * logits).sum(-1)


def padded_step(model, ref, batch: RolloutBatch, algo) -> tuple[float, float]:
    """The whole batch in one padded pass: (loss, grad norm) with gradients left on model's parameters."""
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask.bool()
    logp, entropy = logp_entropy(padded_logits(model, ids, attn, algo.temperature), ids[:, P:])
    old = None
    if algo.old_logprobs == "trainer":
        old = logp.detach()
    loss_mask = rollout_keep(logp.detach() if old is None else old, batch.engine_logprobs, mask, algo)
    weight = top_entropy_mask(entropy.detach(), loss_mask, algo.entropy_top_frac) if algo.entropy_top_frac < 1 \
        else None
    inputs = LossInputs(logp=logp, old_logp=batch.engine_logprobs if old is None else old,
                        engine_logp=batch.engine_logprobs, advantages=batch.advantages, mask=mask, token_weight=weight,
                        denominator=1.0, old_from_trainer=old is not None)
    total = configured_loss(inputs, algo).loss
    if ref is not None:
        with torch.no_grad():
            ref_logp, _ = logp_entropy(padded_logits(ref, ids, attn, algo.temperature), ids[:, P:])
        total = total + algo.kl_coef * aggregate(token_kl(logp, batch.engine_logprobs, ref_logp, algo), loss_mask,
                                                 algo.loss_agg, algo.max_new_tokens, denominator=1.0)
    if algo.entropy_coef > 0:
        total = total - algo.entropy_coef * aggregate(entropy, loss_mask, algo.loss_agg, algo.max_new_tokens,
                                                      denominator=1.0)
    denom = normaliser(loss_mask, algo.loss_agg, algo.max_new_tokens)
    (total / denom).backward()
    return float(total.detach()) / denom, _norm(model)


def on_cpu(batch: RolloutBatch, tokens: int, sequence=None):
    """The batch as a learner trains it (rlgen.learners.token_batch), in micro-batches of tokens, on the CPU."""
    return token_batch(batch, None, tokens, sequence.degree if sequence else 1).on(torch.device("cpu"), sequence)


def accumulate(model, ref, batch: RolloutBatch, algo, sequence=None, teacher=None):
    """(the step, its sums) of the learner's packed step (grpo_step) in micro-batches of algo.micro_batch_tokens,
    each micro-batch's loss backpropagated undivided; with a sequence group, this rank's slice of each
    (rlgen.learners.ulysses); with a teacher, its whole reverse KL in the loss (algo.distill_estimator=full)."""
    step = with_old_logprobs(model, on_cpu(batch, algo.micro_batch_tokens, sequence),
                             algo)
    sums = StepSums(step)
    for micro in step.micros():
        out = micro_loss(model, ref, micro, algo, LossAgg(algo.loss_agg), configured_loss, teacher=teacher)
        out.total.backward()
        sums.add(micro.rows, out.logp.detach(), out.sums())
    return step, sums


def packed_step(model, ref, batch: RolloutBatch, algo) -> tuple[float, float]:
    """The learner's packed step (grpo_step), in micro-batches of algo.micro_batch_tokens."""
    _, sums = accumulate(model, ref, batch, algo)
    denom = sums.get("denom")
    for p in model.parameters():
        p.grad /= denom
    return sums.losses(1.0 / denom, algo)[2], _norm(model)


def _norm(model) -> float:
    return float(torch.sqrt(sum((p.grad ** 2).sum() for p in model.parameters() if p.grad is not None)))


def algo_of(preset: str, **values):
    algo = compose_run_config([f"algo={preset}"]).algo
    return dataclasses.replace(algo, lr=1e-3, max_new_tokens=L, **values)


def near_trainer(model, batch: RolloutBatch, seed: int) -> RolloutBatch:
    """The batch with engine logprobs the trainer's own plus noise (ratios near 1, some past the clip and cap)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        logp, _ = logp_entropy(padded_logits(model, batch.input_ids, batch.attention_mask, 1.0), batch.input_ids[:, P:])
    noise = torch.randn(logp.shape, generator=g) * 0.4
    return dataclasses.replace(batch, engine_logprobs=(logp + noise) * batch.response_mask)


def models(seed: int = 0):
    padded = tiny_qwen2(seed).train()
    padded.config._attn_implementation = "sdpa"
    packed = tiny_qwen2(seed).train()
    use_packed_attention(packed, "sdpa_segments")
    return padded, packed


CASES = [(preset, {}) for preset in PRESETS] + [
    ("grpo", {"kl_coef": 0.3}),
    ("grpo", {"kl_coef": 0.3, "kl_bias_correction": True, "loss_agg": LossAgg.seq_mean_token_mean}),
    ("grpo", {"entropy_coef": 0.05, "temperature": 0.7}),
    ("grpo", {"seq_mask_cap": 1.2}),
    ("grpo", {"old_logprobs": "trainer", "tis_mode": "mask"}),
    ("cispo", {"old_logprobs": "trainer"}),
    ("dr_grpo", {"entropy_top_frac": 0.5}),
    ("grpo", {"tis_mode": "mask", "tis_low": 0.8, "tis_cap": 1.25}),  # a band: tokens out of every denominator
    ("cispo", {"tis_seq_reject": True, "tis_low": 0.7, "tis_cap": 1.5, "loss_agg": LossAgg.seq_mean_token_mean}),
]


@pytest.mark.parametrize("holes", [False, True], ids=["turns", "episodes"])
@pytest.mark.parametrize(("preset", "values"), CASES, ids=[f"{p}-{'-'.join(v) or 'preset'}" for p, v in CASES])
def test_packed_equals_padded(preset, values, holes):
    padded, packed = models()
    batch = near_trainer(padded, random_batch(1, holes), 2)
    one_micro = values.get("entropy_top_frac", 1.0) < 1  # its top fraction is a micro-batch's own
    algo = algo_of(preset, **values, micro_batch_tokens=0 if one_micro else tokens_for(batch, 3))
    if not one_micro:
        assert len(on_cpu(batch, algo.micro_batch_tokens).micro_rows) > 1
    refs = (copy.deepcopy(padded).eval(), copy.deepcopy(packed).eval()) if algo.kl_coef > 0 else (None, None)
    want_loss, want_norm = padded_step(padded, refs[0], batch, algo)
    got_loss, got_norm = packed_step(packed, refs[1], batch, algo)
    assert got_loss == pytest.approx(want_loss, rel=1e-5, abs=1e-6)
    assert got_norm == pytest.approx(want_norm, rel=1e-4) and want_norm > 0
    mine = dict(packed.named_parameters())
    for name, p in padded.named_parameters():
        torch.testing.assert_close(mine[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_logprobs_and_entropy_come_chunk_by_chunk_with_the_same_values_and_gradients():
    padded, packed = models(3)
    batch = random_batch(4)
    mask = batch.response_mask.bool()
    logp, ent = logp_entropy(padded_logits(padded, batch.input_ids, batch.attention_mask, 1.0), batch.input_ids[:, P:])
    one = pack(batch.input_ids, batch.attention_mask, mask, P)
    got_logp, got_ent = packed_forward(packed, one, 1.0, entropy_grad=True, chunk=5)  # several chunks of 5 tokens
    cols = one.resp_len
    torch.testing.assert_close(got_logp[mask[:, :cols]], logp[:, :cols][mask[:, :cols]], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_ent[mask[:, :cols]], ent[:, :cols][mask[:, :cols]], rtol=1e-5, atol=1e-6)
    (logp[mask].sum() + ent[mask].sum()).backward()
    (got_logp[mask[:, :cols]].sum() + got_ent[mask[:, :cols]].sum()).backward()
    mine = dict(packed.named_parameters())
    for name, p in padded.named_parameters():
        torch.testing.assert_close(mine[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_row_is_packed_up_to_its_last_masked_token_and_positions_restart():
    batch = random_batch(5, holes=True)
    mask = batch.response_mask.bool()
    prompt, kept = kept_lengths(batch.attention_mask, mask, P)
    real = batch.attention_mask[:, P:].sum(-1)
    for i in range(N):
        last = int(mask[i].nonzero().max()) + 1 if mask[i].any() else 1  # an empty mask keeps one token
        assert int(kept[i]) == last <= int(real[i])
    one = pack(batch.input_ids, batch.attention_mask, mask, P)
    assert one.tokens == sum(row_tokens(batch.attention_mask, mask, P)) == int((prompt + kept - 1).sum())
    starts = one.cu_seqlens[:-1].tolist()
    assert [int(one.positions[0, s]) for s in starts] == [0] * N
    assert one.targets.numel() == int(kept.sum())


def test_the_reference_model_and_old_logprobs_are_packed_too():
    padded, packed = models(6)
    batch = random_batch(7)
    step = with_old_logprobs(packed, on_cpu(batch, tokens_for(batch, 2)),
                             algo_of("gspo"))
    logp, _ = logp_entropy(padded_logits(padded, batch.input_ids, batch.attention_mask, 1.0), batch.input_ids[:, P:])
    mask = batch.response_mask.bool()
    torch.testing.assert_close(step.old_logp[mask], logp.detach()[mask], rtol=1e-5, atol=1e-6)
