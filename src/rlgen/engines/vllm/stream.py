"""Streaming from a vllm engine (``StreamMethods``, mixed into VLLMEngine): vLLM's DELTA outputs handed over as
they come, from the engine's event loop to the calling thread through a queue, then the whole completions. The
coroutines run on the engine's loop thread (rlgen.engines.vllm.loop), never in the actor's own, so pause() and
weight updates are answered while a stream runs."""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Iterator
from typing import Any

from rlgen.engines.cancel import CANCELLED, next_event
from rlgen.engines.vllm.common import EngineError
from rlgen.engines.vllm.loop import stream_one
from rlgen.engines.vllm.outputs import sampled_logprobs, top_logprobs
from rlgen.generated import GenResult
from rlgen.types import Completion, GenRequest, Phase


class StreamMethods:
    """VLLMEngine's generate_stream; it uses its llm, _loop, _next_call, version, name, timeout_s, asleep and
    its request-building helpers (_prompt, _sampling, _lora_of)."""

    def generate_stream(self, requests: list[GenRequest]) -> Iterator[dict[str, Any]]:
        """generate(), streamed (as HFEngine.generate_stream): {"deltas": [(request, sample, tokens, logprobs, top
        logprobs), ...]} as vLLM hands new tokens over, then {"final": generate()'s result}. Closing the iterator
        early cancels the requests' task, and vLLM aborts them."""
        if self.asleep:
            raise EngineError(f"{self.name} is asleep; call wake() before generate_stream().")
        call = self._next_call()
        t0, v = time.time(), self.version
        events: queue.Queue = queue.Queue()

        def delta(i: int, o: Any) -> tuple:
            toks = list(o.token_ids)
            return (i, o.index, toks, sampled_logprobs(toks, o.logprobs),
                    top_logprobs(o.logprobs, requests[i].sampling.logprobs, len(toks)))

        jobs = [stream_one(self.llm, i, self._prompt(r), self._sampling(r, stream=True), f"{self.name}-{call}-{i}",
                           self._lora_of(r), events.put, delta) for i, r in enumerate(requests)]

        async def run() -> list[dict[int, str]]:
            return await asyncio.gather(*jobs)

        fut = asyncio.run_coroutine_threadsafe(run(), self._loop.loop)
        fut.add_done_callback(lambda _: events.put(None))
        got: dict[tuple[int, int], tuple[list, list, list]] = {}
        try:
            while True:
                try:
                    item = next_event(events, timeout_s=self.timeout_s)
                except TimeoutError:
                    raise EngineError(f"{self.name}: a stream sent nothing for {self.timeout_s:.0f} s.") from None
                if item is None:
                    break
                if item is CANCELLED:
                    return  # the finally below cancels the requests' task
                for i, j, *parts in item:
                    for acc, part in zip(got.setdefault((i, j), ([], [], [])), parts):
                        acc.extend(part)
                yield {"deltas": item}
            reasons = fut.result()
        finally:
            if not fut.done():
                fut.cancel()  # the consumer went away: the task is cancelled and vLLM aborts its requests
        completions = []
        for i, req in enumerate(requests):
            for j in range(req.sampling.n):
                tokens, logprobs, tops = got.get((i, j), ([], [], []))
                completions.append(Completion(req.group_id, list(req.prompt_ids), tokens, logprobs,
                                              finish_reason=reasons[i].get(j, "length"), version=v, top_logprobs=tops))
        yield {"final": GenResult(completions=completions, version=v, spans=[(Phase.generate.value, t0, time.time())])}


__all__ = ["StreamMethods"]
