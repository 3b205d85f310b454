"""The vllm engine's event loop: a daemon thread running one asyncio loop, and the coroutines the engine runs on
it (building AsyncLLM, generating, reading running requests' progress), and how that progress becomes a
completion's version changes. vllm is imported only inside the coroutines.

The coroutines live here, outside ``VLLMEngine``, on purpose: Ray makes any actor class with an ``async def``
method an asyncio actor, whose plain methods then all run on one event loop, so a generate() in progress would
hold back pause() and a weight update until it returned.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from rlgen.engines.base import EngineDead
from rlgen.engines.cancel import CallCancelled, requested
from rlgen.engines.cut_short import Until
from rlgen.errors import causes
from rlgen.types import version_changes


def core_died(err: BaseException) -> bool:
    """Whether an error from AsyncLLM means its engine core is gone: vLLM's EngineDeadError (its core process
    exited), or a CUDA error (the device state is lost). Read by class name and message: no vllm import."""
    return any(type(e).__name__ == "EngineDeadError" or "CUDA error" in str(e) for e in causes(err))


DEAD_POLL_S = 0.5  # a call waiting on the engine checks this often whether its core has died or it was cancelled


class LoopThread:
    """An asyncio loop on a daemon thread; run() submits a coroutine and waits for it with a timeout. ``dead``,
    once set, tells whether the engine core has died: a call waiting on a dead core (a pause, a weight load, a
    generate) then fails within DEAD_POLL_S instead of at its timeout."""

    def __init__(self, name: str):
        self.dead: Callable[[], bool] | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name=f"{name}-loop", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Any, timeout: float, what: str) -> Any:
        """The coroutine's result; an engine core that died (or a CUDA error) raises EngineDead, and a call its
        caller cancelled (rlgen.engines.cancel) cancels the coroutine (vLLM aborts its requests) and raises
        CallCancelled."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return fut.result(max(0.0, min(left, DEAD_POLL_S)))
            except concurrent.futures.TimeoutError as err:
                if self.dead is not None and self.dead():
                    fut.cancel()
                    raise EngineDead(f"{what}: the vLLM engine core died while this call waited on it") from None
                if requested():
                    fut.cancel()
                    raise CallCancelled(f"{what}: cancelled by its caller") from None
                if time.monotonic() >= deadline:
                    fut.cancel()  # cancels the task: vLLM aborts the requests it had started
                    raise TimeoutError(f"{what} did not finish within {timeout:.0f} s") from err
            except Exception as err:
                if core_died(err):
                    raise EngineDead(f"{what}: the vLLM engine core died ({type(err).__name__}: "
                                     f"{str(err).strip()[:200]})") from err
                raise

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


async def build_engine(args: dict[str, Any]) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    # Built inside the loop so AsyncLLM binds its output handler to it.
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))


async def _generate_one(llm: Any, prompt: Any, params: Any, request_id: str, lora: Any = None,
                        finished: list[float] | None = None) -> Any:
    final = None
    async for out in llm.generate(prompt, params, request_id, lora_request=lora):
        final = out
    if finished is not None:
        finished.append(time.time())
    return final


async def generate_all(llm: Any, jobs: list[tuple[Any, Any, str, Any]], finished: list[float] | None = None
                       ) -> list[Any]:
    """Every job (prompt, sampling, request id, its LoRARequest or None) to its final output; each job's finish
    time (the last of its samples) goes to finished when given."""
    return await asyncio.gather(*(_generate_one(llm, *job, finished=finished) for job in jobs))


async def generate_until(llm: Any, jobs: list[tuple[Any, Any, str, Any]], rows: list[int], until: Until,
                         running: Callable[[str], Any]) -> list[Any]:
    """Every job (one sample each, FINAL_ONLY; rows: the request it is a sample of) until ``until`` is met
    (rlgen.engines.cut_short); the jobs still running are then cancelled (vLLM aborts them). Returns each job's
    final output, or for a job cut short what running(request id) read of it just before it was cancelled."""
    tasks = [asyncio.ensure_future(_generate_one(llm, *job)) for job in jobs]
    index = {t: i for i, t in enumerate(tasks)}
    waiting = set(tasks)
    out: list[Any] = [None] * len(jobs)
    try:
        while waiting and not until.met():
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                out[index[t]] = t.result()  # an error in one job ends the call (the finally cancels the others)
                until.row_done(rows[index[t]])
        for t in waiting:  # read before the cancel: an aborted request's state is dropped
            out[index[t]] = running(jobs[index[t]][2])
    finally:
        for t in waiting:
            t.cancel()
        if waiting:
            await asyncio.gather(*waiting, return_exceptions=True)
    return out


def running_requests(llm: Any) -> dict[str, Any]:
    """vLLM's state of each running request by its id (vLLM 0.26 internals; {} where they are not there)."""
    states = getattr(getattr(llm, "output_processor", None), "request_states", None) or {}
    return {getattr(s, "external_req_id", None) or getattr(s, "request_id", None): s for s in list(states.values())}


async def stream_one(llm: Any, index: int, prompt: Any, params: Any, request_id: str, lora: Any,
                     put: Callable[[Any], None], delta: Callable[[int, Any], Any]) -> Any:
    """One request's outputs as they come (params with output_kind DELTA): delta(index, output) for each sample
    that has new tokens is handed to put; returns the outputs' finish reasons by sample index."""
    reasons: dict[int, str] = {}
    async for out in llm.generate(prompt, params, request_id, lora_request=lora):
        deltas = [delta(index, o) for o in out.outputs if o.token_ids]
        if deltas:
            put(deltas)
        reasons.update({o.index: o.finish_reason for o in out.outputs if o.finish_reason})
    return reasons


async def live_token_counts(llm: Any, prefix: str) -> dict[tuple[str, int], int]:
    """Tokens sampled so far by each running request (request id, sample index) whose id starts with prefix.
    Read from vLLM's output processor, where outputs that arrived before a pause have been counted once the
    loop has turned (vLLM 0.26 internals; an engine without them reports nothing)."""
    await asyncio.sleep(0)
    states = getattr(getattr(llm, "output_processor", None), "request_states", None) or {}
    counts = {}
    for state in list(states.values()):
        rid, tokens = getattr(state, "external_req_id", None), getattr(state, "detokenizer", None)
        if isinstance(rid, str) and rid.startswith(prefix) and tokens is not None:
            counts[(rid, int(getattr(state, "request_index", 0) or 0))] = int(tokens.num_output_tokens())
    return counts


__all__ = ["LoopThread", "build_engine", "generate_all", "generate_until", "live_token_counts", "running_requests",
           "version_changes"]
