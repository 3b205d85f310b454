"""On a GPU: torch's varlen FlashAttention over packed rows is as close to an fp32 padded forward as causal SDPA
over each row is, in bf16 (rlgen.learners.attention, rlgen.learners.packed)."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import SMALL_QWEN2
from rlgen.learners.attention import use_packed_attention
from rlgen.learners.packed import pack, packed_forward

pytestmark = pytest.mark.gpu


def _batch(n: int, prompt: int, resp: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, prompt + resp), generator=g)
    attn, mask = torch.zeros_like(ids), torch.zeros(n, resp, dtype=torch.bool)
    for i in range(n):
        p = int(torch.randint(1, prompt + 1, (1,), generator=g))
        r = int(torch.randint(1, resp + 1, (1,), generator=g))
        attn[i, prompt - p: prompt + r], mask[i, :r] = 1, True
    return ids.cuda(), attn.cuda(), mask.cuda()


def _model():
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(**SMALL_QWEN2)
    config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config).to("cuda", torch.bfloat16)


def test_varlen_is_as_close_to_fp32_as_sdpa_over_each_row():
    model = _model()
    prompt, resp = 32, 200
    ids, attn, mask = _batch(12, prompt, resp, SMALL_QWEN2["vocab_size"], 1)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    reference = copy.deepcopy(model).float()
    with torch.no_grad():
        logits = reference(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=positions[:, :-1],
                           logits_to_keep=resp).logits.float()
        want = logits.log_softmax(-1).gather(-1, ids[:, prompt:].unsqueeze(-1)).squeeze(-1)  # [n, L] fp32
    error = {}
    for backend in ("torch_varlen", "sdpa_segments"):
        packed = copy.deepcopy(model)
        use_packed_attention(packed, backend)
        one = pack(ids, attn, mask, prompt)
        with torch.no_grad():
            got = packed_forward(packed, one, 1.0)[0]  # [n, Lm]
        kept = mask[:, : got.shape[1]]
        error[backend] = (got[kept] - want[:, : got.shape[1]][kept]).abs().mean().item()
    # both are bf16 forwards of the same model: varlen's error against fp32 is sdpa's, within bf16's noise
    assert error["torch_varlen"] <= 1.5 * error["sdpa_segments"] + 1e-3, error


def test_the_teachers_whole_reverse_kl_over_varlen_rows_matches_fp32_and_trains():
    # algo.distill_estimator=full on the GPU path: both models in bf16 over packed varlen rows, both LM heads a
    # chunk at a time (chunk smaller than the rows' tokens), against the KL written out in fp32 on padded rows
    from rlgen.learners.packed import packed_forward_taught

    student, teacher = _model(), _model()
    torch.manual_seed(1)
    for p in teacher.parameters():
        p.data.add_(0.02 * torch.randn_like(p))
    prompt, resp = 16, 96
    ids, attn, mask = _batch(8, prompt, resp, SMALL_QWEN2["vocab_size"], 2)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        def logp(m):
            out = copy.deepcopy(m).float()(input_ids=ids[:, :-1], attention_mask=attn[:, :-1],
                                           position_ids=positions[:, :-1], logits_to_keep=resp)
            return out.logits.float().log_softmax(-1)  # [n, L, V]
        s, t = logp(student), logp(teacher)
        want = (s.exp() * (s - t)).sum(-1)  # [n, L]
    use_packed_attention(student, "torch_varlen")
    use_packed_attention(teacher, "torch_varlen")
    one = pack(ids, attn, mask, prompt)
    _, _, kl = packed_forward_taught(student, teacher.eval(), one, 1.0, chunk=64)  # [n, Lm], with grad
    kept = mask[:, : kl.shape[1]]
    got = kl[kept]
    assert torch.isfinite(got).all() and float(got.detach().min()) > -1e-3
    assert (got.detach() - want[:, : kl.shape[1]][kept]).abs().mean().item() < 0.1 * want[mask].mean().item()
    got.mean().backward()
    grads = [p.grad for p in student.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    assert all(p.grad is None for p in teacher.parameters())  # the teacher stays frozen
