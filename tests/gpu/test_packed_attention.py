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
