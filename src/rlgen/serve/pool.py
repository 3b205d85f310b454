"""The server's engines: data-parallel engine actors (each of TP engine.tensor_parallel_size), which request
goes where, and the state clients see (policy version, asleep, paused). Calls go to Ray actors, or, in tests,
to engine objects in this process (``local=True``), through the same code."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rlgen.engines.cancel import run as cancellable
from rlgen.types import GenRequest
from rlgen.wire.protocol import BadRequest, split_by_samples


@dataclass
class ServedModel:
    name: str
    path: str
    params: int
    vocab_size: int
    max_model_len: int
    engine_kind: str  # its name, for people; what the pool does depends on the two flags below
    tensor_parallel_size: int
    tokenizer: Any = None  # for /v1/completions
    # What the engines claim (rlgen.engines.contract); the pool calls a capability's methods only where it is set.
    nccl_weights: bool = False  # ReceivesNccl: vLLM's NCCL weight transfer from a trainer's rank 0
    pauses: bool = False  # PausesInFlight: the engines freeze running requests (and keep their KV cache) on pause()
    adapters: bool = False  # PolicyAdapters and NamedAdapters: a trainer's policy adapter, and named ones
    max_lora_rank: int | None = None  # the largest adapter rank they take; None: any
    config: Any = None  # the served model's shape (a ModelConfig), to check an adapter against before loading it
    dtype: str | None = None  # the engines' weights (what a trainer sends weights in)
    max_logprobs: int | None = None  # the most logprobs per position the engines give (vLLM's max_logprobs); None: any
    nccl_env: dict[str, str] = field(default_factory=dict)  # NCCL_* the engines run with; a trainer joining their
    # NCCL group must run with the same (NCCL cannot join two processes that differ in NCCL_CUMEM_ENABLE)


def _one_per_greedy_sample(requests: list[GenRequest]) -> tuple[list[GenRequest], list[tuple[int, int]]]:
    """A greedy request with n > 1 as n requests of n=1 (vLLM refuses n > 1 without sampling); the
    completions still come back n per request, in order. Also each new request's origin: (request, first sample)."""
    out: list[GenRequest] = []
    origin: list[tuple[int, int]] = []
    for i, r in enumerate(requests):
        s = r.sampling
        if s.temperature <= 0 and s.n > 1:
            out.extend([dataclasses.replace(r, sampling=dataclasses.replace(s, n=1))] * s.n)
            origin.extend((i, k) for k in range(s.n))
        else:
            out.append(r)
            origin.append((i, 0))
    return out, origin


def _ray_cancel(ref: Any) -> None:
    import ray

    ray.cancel(ref)  # a running call of a threaded or plain actor is marked, and the engine stops at its next step


def _engine_spans(index: int, result: dict[str, Any]) -> list[dict[str, Any]]:
    """A weight update's (phase, start, end) spans, each named with the engine that ran it."""
    return [{"engine": index, "phase": p, "start": a, "end": b} for p, a, b in result.get("spans", [])]


class EnginePool:
    """The engines of `rlgen serve`: kinds that are Servable (not served), called through rlgen.engines.contract."""

    def __init__(self, engines: Sequence[Any], model: ServedModel, *, timeout_s: float, local: bool = False):
        self.engines, self.model, self.timeout_s, self.local = list(engines), model, float(timeout_s), local
        self.versions = [0] * len(self.engines)
        self.asleep = [False] * len(self.engines)
        self.paused = [False] * len(self.engines)
        self._resumed = [asyncio.Event() for _ in self.engines]
        for ev in self._resumed:
            ev.set()
        self.updates = 0
        self.requests = 0
        self.sequences = 0
        self.tokens = 0  # completion tokens generated
        self.started = time.time()
        self._locks = [asyncio.Lock() for _ in self.engines]  # local engines run one call at a time, as actors do
        self.in_flight = [0] * len(self.engines)  # calls each engine is working on
        self.adapters: dict[str, str] = {}  # LoRA adapters loaded by name -> their folders (rlgen.serve.lora)
        self.pending_version: int | None = None  # of a weight update a trainer has begun (rlgen.serve.vllm_api)

    # -- calls ---------------------------------------------------------------------------------------------
    async def call(self, index: int, method: str, *args: Any, timeout_s: float | None = None,
                   cancel: bool = False) -> Any:
        """engine ``index``.method(*args), waited for at most timeout_s (the pool's by default). With ``cancel``
        (generation), a call that times out or whose waiter is cancelled (a client that disconnected) is
        cancelled on the engine too, which stops generating at its next step (rlgen.engines.cancel)."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        engine = self.engines[index]
        self.in_flight[index] += 1
        stop: Callable[[], None] | None = None
        try:
            if self.local:
                event = threading.Event()
                stop = event.set
                async with self._locks[index]:
                    return await asyncio.wait_for(asyncio.to_thread(cancellable, event, getattr(engine, method), *args),
                                                  wait)
            ref = getattr(engine, method).remote(*args)
            stop = partial(_ray_cancel, ref)
            return await asyncio.wait_for(ref, wait)
        except asyncio.CancelledError:
            if cancel and stop is not None:
                stop()
            raise
        except TimeoutError as err:
            if cancel and stop is not None:
                stop()
            raise BadRequest(f"engine{index} did not answer {method} within {wait:.0f} s; the server may be "
                             "overloaded (raise serve.request_timeout_s) or the engine stuck.", status=504) from err
        finally:
            self.in_flight[index] -= 1

    def pick(self, engine: int | None) -> list[int]:
        if engine is None:
            return list(range(len(self.engines)))
        if not 0 <= engine < len(self.engines):
            raise BadRequest(f"engine={engine} does not exist; this server has engines 0..{len(self.engines) - 1}.",
                             status=404)
        return [engine]

    def info(self) -> dict[str, Any]:
        m = self.model
        return {"model": m.name, "model_path": m.path, "params": m.params, "vocab_size": m.vocab_size,
                "max_model_len": m.max_model_len, "engine_kind": m.engine_kind,
                "weights_over": ["http", "nccl"][: 2 if m.nccl_weights else 1] + (["adapter"] if m.adapters else []),
                "adapters": sorted(self.adapters), "dtype": m.dtype, "max_lora_rank": m.max_lora_rank if m.adapters else 0,
                "nccl_env": dict(m.nccl_env) if m.nccl_weights else {},
                "tensor_parallel_size": m.tensor_parallel_size, "data_parallel": len(self.engines),
                "version": max(self.versions), "versions": list(self.versions), "asleep": list(self.asleep),
                "paused": list(self.paused), "weight_updates": self.updates, "requests": self.requests,
                "sequences": self.sequences, "uptime_s": time.time() - self.started}

    async def health(self) -> dict[str, Any]:
        """An idle engine is asked (10 s at most); a busy one counts as healthy, since an engine that takes one
        call at a time would answer only after its work, and its calls have their own timeouts."""
        busy = [n > 0 for n in self.in_flight]
        try:
            states = await asyncio.gather(*(self.call(i, "health", timeout_s=10.0) for i in range(len(self.engines))
                                            if not busy[i]))
        except Exception as err:  # noqa: BLE001 - health answers, whatever went wrong
            return {"ok": False, "error": f"{type(err).__name__}: {err}"}
        return {"ok": all(s.get("ok") for s in states), "engines": len(self.engines), "busy": busy,
                "version": max(self.versions)}

    # -- generation ----------------------------------------------------------------------------------------
    async def ready(self, requests: list[GenRequest], engine: int | None) -> list[int]:
        """The awake engines a request may use, once none of them is paused; unknown adapters are refused."""
        unknown = sorted({r.adapter for r in requests if r.adapter is not None and r.adapter not in self.adapters})
        if unknown:
            raise self.no_adapter(unknown[0], "(POST /v1/load_lora_adapter first).")
        chosen = [i for i in self.pick(engine) if not self.asleep[i]]
        if not chosen:
            which = f"engine{engine} is" if engine is not None else "every engine is"
            raise BadRequest(f"{which} asleep; POST /wake first.", status=409)
        for i in chosen:  # a paused engine holds new requests until it is resumed
            try:
                await asyncio.wait_for(self._resumed[i].wait(), self.timeout_s)
            except TimeoutError as err:
                raise BadRequest(f"engine{i} stayed paused for {self.timeout_s:.0f} s; POST /resume.", status=503) from err
        return chosen

    async def generate(self, requests: list[GenRequest], engine: int | None = None) -> dict[str, Any]:
        """Completions in request order (n per request). Without ``engine``, the requests are spread over the
        awake engines by sample count."""
        chosen = await self.ready(requests, engine)
        shards = split_by_samples(_one_per_greedy_sample(requests)[0], len(chosen))
        jobs = [(i, s) for i, s in zip(chosen, shards) if s]
        results = await asyncio.gather(*(self.call(i, "generate", s, cancel=True) for i, s in jobs))
        self.requests += len(requests)
        self.sequences += sum(r.sampling.n for r in requests)
        completions = [c for res in results for c in res.completions]
        self.tokens += sum(len(c.token_ids) for c in completions)
        spans = [span for (i, _), res in zip(jobs, results) for span in res.spans_json(engine=i)]
        return {"completions": completions, "spans": spans, "version": max(res.version for res in results)}

    async def generate_stream(self, requests: list[GenRequest]) -> AsyncGenerator[dict[str, Any], None]:
        """The requests on one engine (the least busy), streamed: {"deltas": [(request, sample, tokens, logprobs,
        top logprobs)], "version": the engine's policy version} as tokens come, then {"final": completions in
        request order, "version"}. Leaving the iteration early
        (a client that disconnected) stops the engine's generation."""
        index = min(await self.ready(requests, None), key=lambda k: self.in_flight[k])
        split, origin = _one_per_greedy_sample(requests)
        version = self.versions[index]  # what the engine tags the stream's completions with: its version at the start
        self.in_flight[index] += 1
        self.requests += len(requests)
        self.sequences += sum(r.sampling.n for r in requests)
        try:
            async with contextlib.aclosing(self._stream(index, split)) as events:  # closed at once when left
                async for event in events:
                    if "deltas" in event:
                        yield {"deltas": [(origin[i][0], origin[i][1] + j, *rest) for i, j, *rest in event["deltas"]],
                               "version": version}
                    else:
                        completions = event["final"].completions
                        self.tokens += sum(len(c.token_ids) for c in completions)
                        yield {"final": completions, "version": event["final"].version}
        finally:
            self.in_flight[index] -= 1

    async def _stream(self, index: int, requests: list[GenRequest]) -> AsyncGenerator[dict[str, Any], None]:
        engine = self.engines[index]
        if self.local:
            async with self._locks[index]:
                cancel = threading.Event()
                events = engine.generate_stream(requests, cancel)
                try:
                    while (event := await asyncio.wait_for(asyncio.to_thread(next, events, None), self.timeout_s)):
                        yield event
                finally:
                    cancel.set()  # no await here: a cancelled task could not wait; generation stops at its next step
            return
        import ray

        events = engine.generate_stream.options(num_returns="streaming").remote(requests)
        finished = False
        try:
            while True:
                try:
                    ref = await asyncio.wait_for(events.__anext__(), self.timeout_s)
                except StopAsyncIteration:
                    finished = True
                    return
                yield await ref
        finally:
            if not finished:
                ray.cancel(events)  # a stream left early: the engine's generator stops at its next step

    # -- weights and memory --------------------------------------------------------------------------------
    def no_adapter(self, name: str, hint: str = "") -> BadRequest:
        return BadRequest(f"no adapter named {name!r} is loaded; loaded: {sorted(self.adapters) or 'none'}"
                          + (f" {hint}" if hint else "."), status=404)

    def awake(self, engine: int | None, what: str) -> list[int]:
        """The picked engines, refused with 409 when one is asleep."""
        picked = self.pick(engine)
        asleep = [i for i in picked if self.asleep[i]]
        if asleep:
            raise BadRequest(f"engine{asleep[0]} is asleep; POST /wake before sending {what}.", status=409)
        return picked

    async def update_weights(self, weights: dict[str, Any], version: int, engine: int | None) -> dict[str, Any]:
        picked = self.awake(engine, "weights")
        results = await asyncio.gather(*(self.call(i, "update_weights", weights, int(version)) for i in picked))
        return self.updated(picked, results, version)

    def updated(self, picked: list[int], results: list[dict[str, Any]], version: int) -> dict[str, Any]:
        for i in picked:
            self.versions[i] = int(version)
        self.updates += 1
        spans = [span for i, r in zip(picked, results) for span in _engine_spans(i, r)]
        return {"version": int(version), "engines": picked, "spans": spans}

    async def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float, engine: int | None) -> list[Any]:
        self._need_vllm("weight transfer")
        return list(await asyncio.gather(*(self.call(i, "init_weight_transfer", init_info, timeout_s,
                                                     timeout_s=timeout_s + 30) for i in self.pick(engine))))

    async def receive_weights(self, update_info: dict[str, Any], version: int, timeout_s: float,
                              engine: int | None) -> dict[str, Any]:
        self._need_vllm("weight transfer")
        picked = self.pick(engine)
        results = await asyncio.gather(*(self.call(i, "receive_weights", update_info, int(version), timeout_s,
                                                   timeout_s=timeout_s + 30) for i in picked))
        return self.updated(picked, list(results), version)

    def _need_vllm(self, what: str) -> None:
        if not self.model.nccl_weights:
            raise BadRequest(f"{what} over NCCL needs engines that take it, and this server runs {self.model.engine_kind} "
                             "engines; send weights over HTTP (engine.weights_over=http).", status=409)

    async def sleep(self, level: int, engine: int | None) -> dict[str, Any]:
        picked = self.pick(engine)
        await asyncio.gather(*(self.call(i, "sleep", int(level)) for i in picked))
        for i in picked:
            self.asleep[i] = True
        return {"asleep": list(self.asleep)}

    async def wake(self, tags: list[str] | None, engine: int | None) -> dict[str, Any]:
        picked = self.pick(engine)
        args = (tags,) if tags else ()
        await asyncio.gather(*(self.call(i, "wake", *args) for i in picked))
        if not tags or "kv_cache" in tags:
            for i in picked:
                self.asleep[i] = False
        return {"asleep": list(self.asleep)}

    async def pause(self, engine: int | None) -> dict[str, Any]:
        """New requests wait; vllm engines also freeze the requests they are running, with their KV cache."""
        picked = self.pick(engine)
        for i in picked:
            self.paused[i] = True
            self._resumed[i].clear()
        if self.model.pauses:
            await asyncio.gather(*(self.call(i, "pause", "keep", False) for i in picked))
        return {"paused": list(self.paused)}

    async def resume(self, engine: int | None) -> dict[str, Any]:
        picked = self.pick(engine)
        if self.model.pauses:
            await asyncio.gather(*(self.call(i, "resume") for i in picked))
        for i in picked:
            self.paused[i] = False
            self._resumed[i].set()
        return {"paused": list(self.paused)}
