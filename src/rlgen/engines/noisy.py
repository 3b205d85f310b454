"""An engine that reports wrong logprobs on purpose: the hf engine plus Gaussian noise on every logprob it
reports (sampled tokens in ``generate``, teacher-forced tokens in ``score``).

The tokens are exactly those the hf engine samples; only the reported numbers drift, the way a buggy or
low-precision inference engine drifts from the trainer. With noise of std s on each token the k3 KL the
learner measures is about exp(s**2 / 2) - 1 (s = 0.1: 0.005; s = 0.5: 0.13). Used to show that the
mismatch breaker and ``rlgen validate`` catch such an engine. Same constructor as HFEngine plus
``noise_std``, so ``ray.remote(NoisyEngine)`` runs it as an engine actor.
"""

from __future__ import annotations

from typing import Any

import torch

from rlgen.config import EngineConfig
from rlgen.engines.hf.engine import HFEngine
from rlgen.generated import GenResult
from rlgen.types import GenRequest


class NoisyEngine(HFEngine):
    def __init__(
        self,
        model_path: str,
        engine: EngineConfig,
        device: str = "cpu",
        seed: int = 0,
        name: str = "engine0",
        threads: int | None = 1,
        noise_std: float = 0.1,
        version: int = 0,
    ):
        if noise_std < 0:
            raise ValueError(f"noise_std={noise_std} must be >= 0.")
        super().__init__(model_path, engine, device=device, seed=seed, name=name, threads=threads, version=version)
        self.noise_std = float(noise_std)
        self._noise = torch.Generator().manual_seed(seed + 7_654_321)  # independent of the sampling RNG

    def _noisy(self, values: list[float]) -> list[float]:
        if not values or self.noise_std == 0:
            return list(values)
        noise = torch.randn(len(values), generator=self._noise, dtype=torch.float64) * self.noise_std
        return [v + float(e) for v, e in zip(values, noise)]

    def generate(self, requests: list[GenRequest], version: int | None = None) -> GenResult:
        out = super().generate(requests, version)
        for c in out.completions:
            c.logprobs = self._noisy(c.logprobs)
        return out

    def score(self, prompt_ids: list[list[int]], token_ids: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        return [self._noisy(row) for row in super().score(prompt_ids, token_ids, temperature)]

    def health(self) -> dict[str, Any]:
        return {**super().health(), "noise_std": self.noise_std}


__all__ = ["NoisyEngine"]
