"""Trainer/engine logprob mismatch on the same sampled tokens. Pure torch; returns plain floats."""

from __future__ import annotations

import torch

# how each of mismatch_metrics' values merges over the learner group's ranks (rlgen.metrics.reduce), the means
# weighted by the tokens each rank compared
MISMATCH_REDUCTIONS = {
    "k3_kl": "mean:mismatch/tokens", "mean_abs_delta": "mean:mismatch/tokens",
    "frac_over_threshold": "mean:mismatch/tokens", "max_abs_delta": "max", "tokens": "sum",
}


def mismatch_metrics(
    trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, threshold: float
) -> dict[str, float]:
    """Compare trainer_logp [N, L] with engine_logp [N, L] on the tokens under mask [N, L].

    With r = trainer_logp - engine_logp on each masked token (the tokens were sampled by the engine):
      k3_kl               mean of exp(r) - r - 1, the k3 estimate of KL(engine || trainer)
      mean_abs_delta      mean |r|
      max_abs_delta       max |r|
      frac_over_threshold fraction of tokens with |r| > threshold (a non-finite r counts as over)
      tokens              number of masked tokens
    No masked tokens: every value is 0. A non-finite r is never hidden: max_abs_delta (and the means)
    become inf or nan. Computed in float64.
    """
    m = mask.bool()  # [N, L]
    r = (trainer_logp.detach().double() - engine_logp.detach().double())[m]  # [tokens]
    tokens = int(r.numel())
    if tokens == 0:
        return {
            "k3_kl": 0.0,
            "mean_abs_delta": 0.0,
            "max_abs_delta": 0.0,
            "frac_over_threshold": 0.0,
            "tokens": 0,
        }
    abs_r = r.abs()  # [tokens]
    return {
        "k3_kl": float((torch.exp(r) - r - 1.0).mean().item()),
        "mean_abs_delta": float(abs_r.mean().item()),
        "max_abs_delta": float(abs_r.max().item()),
        "frac_over_threshold": float((~(abs_r <= threshold)).double().mean().item()),
        "tokens": tokens,
    }


# Response-length buckets the mismatch is kept by: (name, fewest tokens, most tokens)
LENGTH_BUCKETS = (("0-1k", 0, 1024), ("1k-8k", 1025, 8192), ("8k-32k", 8193, 32768), ("32k+", 32769, None))
BY_LENGTH = "by_length"  # the keys: by_length/<bucket>/<k3_kl | mean_abs_delta | max_abs_delta | tokens>


def response_lengths(mask: torch.Tensor) -> torch.Tensor:
    """Each row's response length [N]: up to its last token under mask [N, L] (an episode's turns and the
    environment's answers between them), 0 for a row with none."""
    cols = torch.arange(1, mask.shape[1] + 1, device=mask.device)  # [L]
    return (mask.bool() * cols).amax(dim=-1) if mask.shape[1] else torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)


def mismatch_by_length(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                       threshold: float) -> dict[str, float]:
    """mismatch_metrics (less frac_over_threshold) of the rows in each response-length bucket that has any,
    as by_length/<bucket>/<name>: engine numerics are reported to drift with length."""
    lengths = response_lengths(mask)  # [N]
    out: dict[str, float] = {}
    for name, low, high in LENGTH_BUCKETS:
        rows = (lengths >= max(low, 1)) & (lengths <= (high if high is not None else lengths.max().item()))
        if not bool(rows.any()):
            continue
        one = mismatch_metrics(trainer_logp[rows], engine_logp[rows], mask[rows], threshold)
        out.update({f"{BY_LENGTH}/{name}/{k}": v for k, v in one.items() if k != "frac_over_threshold"})
    return out
