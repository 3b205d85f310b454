"""The hf engine's attention (rlgen.engines.hf.attention): grouped key/value heads repeated before
scaled_dot_product_attention give what transformers' sdpa gives, for padded rows, an unpadded row and decode
steps against a KV cache."""

from __future__ import annotations

import copy

import torch

from helpers import tiny_qwen2
from rlgen.engines.hf.attention import NAME, use_causal_sdpa


def _pair():
    ours = tiny_qwen2(3).eval()
    ours.config._attn_implementation = "sdpa"
    theirs = copy.deepcopy(ours)
    use_causal_sdpa(ours)
    assert ours.config._attn_implementation == NAME and ours.config.num_key_value_heads < ours.config.num_attention_heads
    return ours, theirs


def test_padded_rows_and_an_unpadded_row_score_as_sdpa_does():
    ours, theirs = _pair()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 32, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :4], mask[2, :7] = 0, 0  # left padding
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        for kwargs in ({"attention_mask": mask, "position_ids": pos}, {}):
            a, b = (m(input_ids=ids, **kwargs).logits for m in (ours, theirs))
            keep = mask.bool() if kwargs else torch.ones_like(mask, dtype=torch.bool)
            torch.testing.assert_close(a[keep], b[keep], rtol=1e-5, atol=1e-5)


def test_decoding_against_a_cache_generates_as_sdpa_does():
    ours, theirs = _pair()
    ids = torch.randint(3, 32, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    outs = [m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, output_logits=True,
                       return_dict_in_generate=True, pad_token_id=0) for m in (ours, theirs)]
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    for a, b in zip(outs[0].logits, outs[1].logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
