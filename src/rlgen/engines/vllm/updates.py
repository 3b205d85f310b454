"""Weight updates on a vllm engine: ``UpdateMethods``, the engine's calls that put new weights into the running
engine (mixed into VLLMEngine), run in the engine actor's own process. ``update_weights`` sends them through vLLM's
collective_rpc in chunks (the object-store path); the rest drive vLLM's native weight transfer: a trainer's NCCL
group (init, start, receive, finish) and a colocated learner's resident CUDA IPC buffer (``receive_ipc``). What
each vLLM worker runs meanwhile is ``rlgen.sync.receiver``; the driver's side is ``rlgen.sync.transports``. Each
update ends by dropping the prefix cache and taking the new policy version; an update while requests run notes how
far each had got."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rlgen.engines.base import EngineDead
from rlgen.engines.cancel import CallCancelled
from rlgen.engines.vllm.common import CONTROL_TIMEOUT_S, EngineError, nccl_join_failed
from rlgen.engines.vllm.loop import live_token_counts
from rlgen.sync.receiver import (
    chunk_weights,
    load_ipc_on_worker,
    load_weights_on_worker,
    receive_nccl_on_worker,
    to_wire,
)
from rlgen.types import Phase

if TYPE_CHECKING:
    import torch

_TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float32": "float32"}


class UpdateMethods:
    """VLLMEngine's weight updates; they use its llm, _loop, _lock, name, engine_cfg, version, asleep, slept_level,
    weights_on_gpu, paused, salt_prefix_cache, _update_t0, _version_changes, pause() and resume(); each sets
    base_replaced."""

    # -- weights ----------------------------------------------------------------------------------------
    def _wire_dtype(self) -> Any:
        import torch

        name = _TORCH_DTYPES.get(str(self.engine_cfg.dtype))
        return getattr(torch, name) if name else None

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> dict[str, Any]:
        """Load new weights (Hugging Face names; all of them or a subset) into the running engine, then drop
        the prefix cache, whose KV was computed with the old weights.

        The tensors travel to the workers in ~1 GiB chunks through vLLM's collective_rpc (as raw bytes, which
        its RPC decoder passes through untouched), cast to the engine's dtype on the way. Call pause() first
        for a clean version boundary while requests run.
        """
        if self.asleep:
            raise EngineError(f"{self.name} is asleep; wake() it before update_weights().")
        t0 = time.time()
        self.base_replaced = True
        items = weights.items() if isinstance(weights, Mapping) else weights
        wire = self._wire_dtype()

        def prepared() -> Iterable[tuple[str, torch.Tensor]]:
            for name, t in items:
                t = t.detach()
                if wire is not None and t.is_floating_point() and t.dtype != wire:
                    t = t.to(wire)
                yield name, t

        sent = nbytes = 0
        for chunk in chunk_weights(prepared()):
            payload = [to_wire(name, t) for name, t in chunk]
            self._loop.run(
                self.llm.collective_rpc(load_weights_on_worker, timeout=CONTROL_TIMEOUT_S, args=(payload,)),
                CONTROL_TIMEOUT_S,
                f"{self.name}: loading a weight chunk",
            )
            sent += len(chunk)
            nbytes += sum(len(raw) for *_, raw in payload)
        if sent == 0:
            raise EngineError(f"{self.name}: update_weights() got no tensors.")
        reset = self._loop.run(
            self.llm.reset_prefix_cache(), CONTROL_TIMEOUT_S, f"{self.name}: prefix-cache reset"
        )
        self.version = int(version)
        t1 = time.time()
        return {
            "version": self.version,
            "spans": [(Phase.sync.value, t0, t1)],
            "tensors": sent,
            "bytes": nbytes,
            "seconds": t1 - t0,
            "prefix_cache_reset": bool(reset),
        }

    # -- vLLM's native weight transfer (engine built with weight_transfer_config) ------------------------
    def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
        """Join the trainer's transfer channel (NCCL: the trainer's process group; IPC: nothing to join).
        Needs ``engine_args={"weight_transfer_config": {"backend": "nccl" | "ipc"}}`` at construction. Blocks
        until every NCCL rank has joined, so the trainer side must be started concurrently."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        t0 = time.time()
        try:
            self._loop.run(
                self.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=dict(init_info))),
                timeout_s,
                f"{self.name}: joining the weight-transfer channel",
            )
        except (EngineError, EngineDead, CallCancelled, TimeoutError):
            raise  # the loop's own sentences: a dead core, a cancelled call, a trainer that never joined
        except Exception as err:  # vLLM's join itself failed
            raise EngineError(nccl_join_failed(self.name, init_info, err)) from err
        self.salt_prefix_cache = True
        return {"actor": self.name, "spans": [(Phase.sync.value, t0, time.time())]}

    def _check_weights_on_gpu(self) -> None:
        """A weight update needs the engine's weights on its GPU (not asleep, or woken with its weights)."""
        if not self.weights_on_gpu:
            raise EngineError(f"{self.name} is asleep; wake(['weights']) it before a weight update.")

    def start_weight_update(self, timeout_s: float = CONTROL_TIMEOUT_S) -> None:
        self._check_weights_on_gpu()
        self._loop.run(self.llm.start_weight_update(), timeout_s, f"{self.name}: start_weight_update")

    def reset_prefix_cache(self, timeout_s: float = CONTROL_TIMEOUT_S) -> bool:
        """Drop the prefix cache (False while paused requests hold blocks)."""
        return bool(self._loop.run(self.llm.reset_prefix_cache(), timeout_s, f"{self.name}: prefix-cache reset"))

    def _take_version(self, version: int, timeout_s: float) -> dict[str, Any]:
        """The end of every update: drop the prefix cache, note where running requests were (an in-flight
        update), take the new version."""
        reset = self._loop.run(self.llm.reset_prefix_cache(), timeout_s, f"{self.name}: prefix-cache reset")
        if self.paused:
            self._mark_version(version)
        self.version = int(version)
        return {"version": self.version, "prefix_cache_reset": bool(reset)}

    def receive_ipc(self, handle: dict[str, Any], chunk: dict[str, Any], version: int, *, first: bool = True,
                    last: bool = True, pause: bool = False, timeout_s: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
        """Load one chunk of a colocated learner's resident IPC buffer (rlgen.sync.ipc_buffer) into the
        running engine. pause=True (an update while requests run): pause them, keeping their KV cache, before
        the first chunk and resume them after the last, all inside this actor, so the pause lasts the loads
        only. The last chunk drops the prefix cache and takes the new policy version. After sleep level 2 the
        load goes through vLLM's layerwise reload (start/finish) with copies of the views."""

        self._check_weights_on_gpu()
        t0 = time.time()
        self.base_replaced = True
        if first:
            self._update_t0 = t0
        reload = self.asleep and self.slept_level == 2
        if first and pause:
            self.pause("keep")
        try:
            if first and reload:
                self.start_weight_update(timeout_s)
            self._loop.run(
                self.llm.collective_rpc(load_ipc_on_worker, timeout=timeout_s, args=(handle, chunk, reload)),
                timeout_s,
                f"{self.name}: loading {len(chunk['names'])} tensors over IPC",
            )
            out: dict[str, Any] = {"actor": self.name, "version": self.version}
            if last:
                if reload:
                    self._loop.run(self.llm.finish_weight_update(), timeout_s, f"{self.name}: finish_weight_update")
                out.update(self._take_version(version, timeout_s))
        except BaseException:
            if pause and self.paused:
                self.resume()  # a failed update must not leave the requests frozen
            raise
        if last and pause:
            self.resume()
        # the last chunk's span covers the whole update: with pause, the time the engine did not generate
        out["spans"] = [(Phase.sync.value, self._update_t0 if last else t0, time.time())]
        return out

    def _mark_version(self, version: int) -> None:
        """While paused for an in-flight update: note how many tokens each running request has sampled, so its
        completion can say which tokens came after the update."""
        counts = self._loop.run(live_token_counts(self.llm, f"{self.name}-"), CONTROL_TIMEOUT_S,
                                f"{self.name}: reading the requests' progress")
        with self._lock:
            for key, n in counts.items():
                self._version_changes.setdefault(key, []).append((n, int(version)))

    def receive_weights(
        self, update_info: dict[str, Any], version: int, timeout_s: float = CONTROL_TIMEOUT_S, *, pause: bool = False
    ) -> dict[str, Any]:
        """A whole NCCL update in one call to the workers, concurrently with the trainer's broadcast: each worker
        receives the packed weights and loads them in place (``receive_nccl_on_worker``); then the prefix cache
        goes and the new version is taken. pause=True (an update while requests run): this actor pauses them,
        keeping their KV cache, right before the receive and resumes them right after, so the requests wait only
        for the update itself. A timeout leaves vLLM's worker blocked in NCCL: the engine must then be restarted,
        so its requests are not resumed."""
        self._check_weights_on_gpu()
        t0 = time.time()
        self.base_replaced = True
        if pause:
            self.pause("keep")
        t1 = time.time()
        try:
            self._loop.run(
                self.llm.collective_rpc(receive_nccl_on_worker, timeout=timeout_s, args=(dict(update_info),)),
                timeout_s,
                f"{self.name}: receiving {len(update_info.get('names', ()))} tensors over NCCL",
            )
            t2 = time.time()
            out = {"actor": self.name, **self._take_version(version, timeout_s)}
        except (TimeoutError, EngineDead, CallCancelled):
            raise  # its workers may still sit in the broadcast: the engine is restarted, not resumed
        except BaseException:
            if pause and self.paused:
                self.resume()  # a failed update must not leave the requests frozen
            raise
        t3 = time.time()
        if pause:
            self.resume()
        t4 = time.time()
        parts = {"receive": t2 - t1, "version": t3 - t2}
        if pause:  # not "pause": the step record's sync_pause_s is the whole time the engines did not generate
            parts.update(pausing=t1 - t0, resuming=t4 - t3)
        out.update(tensors=len(update_info.get("names", ())), spans=[(Phase.sync.value, t0, t4)], seconds=t4 - t0,
                   parts=parts)
        return out


__all__ = ["UpdateMethods"]
