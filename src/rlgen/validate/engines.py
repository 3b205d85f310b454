"""Where `rlgen validate` runs its engines: in this process or in a Ray actor, behind one small interface
(``call(method, *args)``, ``close()``), and the hf engine with perturbed weights. Which methods it calls is the
engine contract's business (rlgen.engines.contract: what the kind's spec claims), not the host's."""

from __future__ import annotations

import asyncio
import inspect
import os
from typing import Any

from rlgen.config import Perturb


def perturbed_hf_engine_cls() -> type:
    """PerturbedHFEngine, defined on first use so that importing this module does not import torch."""
    from rlgen.engines.hf.engine import HFEngine

    class PerturbedHFEngine(HFEngine):
        """The hf engine with every floating-point weight rounded through ``perturb`` (none: unchanged)."""

        def __init__(self, *args: Any, perturb: str = "none", **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.perturb = Perturb(perturb)
            self._round()

        def _round(self) -> None:
            import torch

            if self.perturb is Perturb.none:
                return
            fmt = getattr(torch, self.perturb.value)
            with torch.no_grad():
                for p in self.model.parameters():
                    if p.is_floating_point():
                        p.copy_(p.to(fmt).to(p.dtype))

        def update_weights(self, weights, version):
            out = super().update_weights(weights, version)
            self._round()
            return out

    return PerturbedHFEngine


class InProcess:
    """The engine in this process. Awaitable results run on one persistent event loop (async engines)."""

    def __init__(self, cls: type, args: tuple, kwargs: dict):
        self.engine = cls(*args, **kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None

    def call(self, method: str, *args: Any) -> Any:
        out = getattr(self.engine, method)(*args)
        if inspect.isawaitable(out):
            self._loop = self._loop or asyncio.new_event_loop()
            out = self._loop.run_until_complete(out)
        return out

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()


class InActor:
    """The engine in a Ray actor, created the way a run creates engine actors."""

    def __init__(self, cls: type, args: tuple, kwargs: dict, num_gpus: float, timeout_s: float):
        import ray

        self.timeout_s = timeout_s
        self._started = False
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            init: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
            if address:
                init["address"] = address
            else:
                init.update(address="local", num_cpus=max(os.cpu_count() or 1, 2))
            ray.init(**init)
            self._started = True
        self.handle = ray.remote(cls).options(num_cpus=1, num_gpus=num_gpus).remote(*args, **kwargs)
        self.call("health")

    def call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.handle, method).remote(*args), timeout=self.timeout_s)

    def close(self) -> None:
        import ray

        ray.kill(self.handle)
        if self._started:
            ray.shutdown()
