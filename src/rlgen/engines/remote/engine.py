"""engine=remote: an engine actor that forwards every call of the engine protocol to one engine of a running
`rlgen serve` over HTTP. The run's loop, fault handling, balancer and weight transports treat it like an
engine of their own: generate, update_weights (safetensors over HTTP), load_adapter (a LoRA adapter over HTTP; or,
for a check that must leave the server's policy alone, use_named_adapter: one loaded by name from a folder),
vLLM's NCCL weight transfer (init_weight_transfer / receive_weights, with the learner as rank 0), sleep/wake,
pause/resume, health."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import uuid
from typing import Any

from rlgen.config import EngineConfig
from rlgen.engines.base import EngineStartError
from rlgen.generated import GenResult
from rlgen.hostinfo import process_info
from rlgen.types import GenRequest, Phase
from rlgen.wire.client import GenerationClient, ServerError
from rlgen.wire.protocol import TOKEN_ENV

START_TIMEOUT_S = 30.0


def server_token(engine: EngineConfig) -> str | None:
    return engine.token or os.environ.get(TOKEN_ENV) or None


class RemoteEngine:
    def __init__(self, model_path: str, engine: EngineConfig, device: str = "cpu", seed: int = 0,
                 name: str = "engine0", version: int = 0, timeout_s: float = 600.0):
        """Engine ``name`` (engineK) of the run speaks for engine K of the server at engine.url (the plan checked
        that the server has it). model_path, device and seed belong to the server, which built its engines."""

        t0 = time.time()
        self.name, self.url = name, str(engine.url)
        self.index = int(name.removeprefix("engine")) if name.removeprefix("engine").isdigit() else 0
        self.client = GenerationClient(self.url, token=server_token(engine), timeout_s=timeout_s)
        try:
            info = self.client.info()
            health = self.client.health()
        except ServerError as err:
            raise EngineStartError(name, str(err)) from None
        if not health.get("ok"):
            raise EngineStartError(name, f"the rlgen server at {self.url} reports unhealthy engines ({health}).")
        self.version = int(info["versions"][self.index])
        self.start_s = time.time() - t0
        self.named: str | None = None  # a named adapter this engine loaded on the server and generates with

    def generate(self, requests: list[GenRequest], version: int | None = None) -> GenResult:
        """The server engine's result; its spans are on the server's clock."""
        if self.named is not None:  # requests that name no adapter of their own use it, not the server's policy
            requests = [r if r.adapter else dataclasses.replace(r, adapter=self.named) for r in requests]
        out = self.client.generate(requests, engine=self.index)
        self.version = out.version
        return GenResult(completions=out.completions, version=out.version, spans=GenResult.spans_from_json(out.spans))

    def update_weights(self, weights: Any, version: int) -> dict[str, Any]:
        t0 = time.time()
        return self._updated(self.client.update_weights(weights, version, engine=self.index), t0)

    def load_adapter(self, adapter: dict[str, Any], version: int, timeout_s: float | None = None) -> dict[str, Any]:
        """A LoRA learner's adapter becomes the server engine's policy (megabytes over HTTP)."""
        t0 = time.time()
        return self._updated(self.client.update_adapter(adapter, version, engine=self.index), t0)

    def use_named_adapter(self, path: str) -> str:
        """Load the adapter folder at path (a path the server can read) on the server under a name of this
        engine's own, and generate with it from now on; the server's policy, which other clients use, stays.
        Returns the name; drop_named_adapter() unloads it."""
        name = f"rlgen-{self.name}-{uuid.uuid4().hex[:8]}"
        self.client.load_lora_adapter(name, path)
        self.named = name
        return name

    def drop_named_adapter(self) -> None:
        if self.named is not None:
            name, self.named = self.named, None
            self.client.unload_lora_adapter(name)

    def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
        return self.client.init_weight_transfer(init_info, timeout_s, engine=self.index)["results"][0]

    def receive_weights(self, update_info: dict[str, Any], version: int, timeout_s: float = 300.0, *,
                        pause: bool = False) -> dict[str, Any]:
        """pause=True (an update while requests run): the server's engine is paused for the receive and resumed
        after it; after a failed receive, resuming is tried and the receive's own error is raised."""
        t0 = time.time()
        if pause:
            self.pause()
        try:
            out = self.client.receive_weights(update_info, version, timeout_s, engine=self.index)
        except BaseException:
            if pause:
                with contextlib.suppress(Exception):
                    self.resume()
            raise
        if pause:
            self.resume()
        return self._updated(out, t0)

    def _updated(self, out: dict[str, Any], t0: float) -> dict[str, Any]:
        """The sync span is the whole call, the transfer to the server included (the server's own span, the
        load into its engine, is part of it)."""
        self.version = int(out["version"])
        return {"version": self.version, "actor": self.name, "spans": [(Phase.sync.value, t0, time.time())],
                "server_load_s": sum(s["end"] - s["start"] for s in out.get("spans", []))}

    def sleep(self, level: int = 1) -> None:
        self.client.sleep(level, engine=self.index)

    def wake(self, tags: list[str] | None = None) -> None:
        self.client.wake(tags, engine=self.index)

    def pause(self, mode: str = "keep", clear_cache: bool = False) -> None:
        self.client.pause(engine=self.index)

    def resume(self) -> None:
        self.client.resume(engine=self.index)

    def health(self) -> dict[str, Any]:
        h = self.client.health()
        return {"ok": bool(h.get("ok")), "name": self.name, "version": self.version, "server": self.url,
                "start_s": self.start_s, **process_info()}
