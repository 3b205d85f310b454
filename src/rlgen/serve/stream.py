"""Server-sent events for ``stream=true`` on /v1/completions and /v1/chat/completions, in OpenAI's chunk format:
text as the engine makes it, each chunk with the logprobs of its tokens, a last chunk per choice with its finish
reason, a usage chunk when ``stream_options.include_usage`` is set, then ``data: [DONE]``. Text that could be the
start of a stop string is held back until it is known not to be one; a stop string ends its choice, and the
tokens after it are neither sent nor counted. A client that goes away stops the engine's generation."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import StreamingResponse

from rlgen.serve.http import failure
from rlgen.serve.openai import (
    Shape,
    answer_id,
    chat_logprobs,
    completion_logprobs,
    cut_at_stop,
    served_name,
    usage_of,
)
from rlgen.types import GenRequest
from rlgen.wire.protocol import error_body


@dataclass
class _Choice:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[dict[int, float]] = field(default_factory=list)
    sent_text: int = 0  # characters of its text sent
    sent_tokens: int = 0  # tokens whose logprobs were sent
    kept: int | None = None  # tokens returned, once a stop string has cut the choice
    reason: str | None = None


class Chunks:
    """The chunks of one streamed request."""

    def __init__(self, reqs: list[GenRequest], stops: list[str], model: Any, chat: bool, shape: Shape):
        self.reqs, self.stops, self.model, self.chat, self.shape = reqs, stops, model, chat, shape
        self.tok = model.tokenizer
        self.id = answer_id(chat)
        self.created = int(time.time())
        self.name = served_name(reqs, model)
        self.first = [sum(r.sampling.n for r in reqs[:i]) for i in range(len(reqs))]
        self.choices = [_Choice() for _ in range(sum(r.sampling.n for r in reqs))]
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.version = 0

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        obj = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
               "created": self.created, "model": self.name, "choices": choices, **extra}
        return f"data: {json.dumps(obj)}\n\n"

    def start(self) -> list[str]:
        if not self.chat:
            echoed = [(k, self.shape.echoed(self.tok, r)) for i, r in enumerate(self.reqs)
                      for k in range(self.first[i], self.first[i] + r.sampling.n)]
            return [self._chunk([{"index": k, "text": text, "logprobs": None, "finish_reason": None,
                                  "policy_version": self.version} for k, text in echoed])] if self.shape.echo else []
        return [self._chunk([{"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None, "policy_version": self.version}
                             for k in range(len(self.choices))])]

    def add(self, i: int, j: int, tokens: list[int], logprobs: list[float], tops: list[dict[int, float]]) -> list[str]:
        k = self.first[i] + j
        c = self.choices[k]
        if c.kept is not None:
            return []
        c.tokens += tokens
        c.logprobs += logprobs
        c.tops += tops
        return self._advance(k, None)

    def finish(self, completions: list[Any], version: int) -> list[str]:
        """The last chunks, from the engine's final completions (finish reasons; any token a delta missed)."""
        self.version = version
        out = []
        for k, comp in enumerate(completions):
            c = self.choices[k]
            if c.kept is None:
                c.tokens, c.logprobs, c.tops = list(comp.token_ids), list(comp.logprobs), list(comp.top_logprobs)
                out += self._advance(k, comp.finish_reason)
        return out

    def _advance(self, k: int, final_reason: str | None) -> list[str]:
        c = self.choices[k]
        n, text, cut = cut_at_stop(self.tok, c.tokens, self.stops)
        if cut:
            c.kept, c.reason, upto = n, "stop", len(text)
        elif final_reason is not None:
            c.kept, c.reason, upto = n, final_reason, len(text)
        else:
            upto = len(text) - self.hold - (1 if text.endswith("\ufffd") else 0)  # a stop string's start, a cut character
            if upto <= c.sent_text:
                return []
        start = c.sent_text
        piece, c.sent_text = text[c.sent_text : upto], max(c.sent_text, upto)
        last = c.kept if c.kept is not None else len(c.tokens)
        ids = c.tokens[c.sent_tokens : last]
        lps, tops = c.logprobs[c.sent_tokens : last], c.tops[c.sent_tokens : last]
        c.sent_tokens = max(c.sent_tokens, last)
        return [self._chunk([self._choice(k, piece, ids, lps, tops, c.reason, start)])]

    def _choice(self, k: int, piece: str, ids: list[int], lps: list[float], tops: list[dict[int, float]],
                reason: str | None, start: int) -> dict[str, Any]:
        logprobs = None
        if self.shape.logprobs:
            logprobs = (chat_logprobs(self.tok, ids, lps, tops, self.shape) if self.chat
                        else completion_logprobs(self.tok, ids, lps, tops, self.shape, start))
        if self.chat:
            return {"index": k, "delta": {"content": piece} if piece else {}, "logprobs": logprobs,
                    "finish_reason": reason, "policy_version": self.version}
        return {"index": k, "text": piece, "logprobs": logprobs, "finish_reason": reason,
                "policy_version": self.version}

    def usage(self) -> str:
        completion = sum(c.kept if c.kept is not None else len(c.tokens) for c in self.choices)
        return self._chunk([], usage=usage_of(self.reqs, completion))


async def sse(events: AsyncGenerator[dict[str, Any], None], chunks: Chunks, include_usage: bool,
              release: Any = None) -> AsyncGenerator[str, None]:
    """The event stream of one request; when it ends, however it ends, ``events`` is closed (which stops the
    engine's generation) and ``release`` is called."""
    started = False
    try:
        async for event in events:
            chunks.version = int(event.get("version", chunks.version))
            if not started:  # the first chunks, once the engine (and so the policy version) is known
                started = True
                for line in chunks.start():
                    yield line
            if "deltas" in event:
                for delta in event["deltas"]:
                    for line in chunks.add(*delta):
                        yield line
            else:
                for line in chunks.finish(event["final"], int(event["version"])):
                    yield line
        if include_usage:
            yield chunks.usage()
        yield "data: [DONE]\n\n"
    except Exception as err:  # noqa: BLE001 - the status is sent; the error goes in the stream, in OpenAI's shape
        yield f"data: {json.dumps(error_body(f'the engines failed: {failure(err)}', 500))}\n\n"
    finally:
        await events.aclose()
        if release is not None:
            release()


class ClosingStream(StreamingResponse):
    """A StreamingResponse that closes its body when it ends. Starlette stops sending when the client leaves, but
    leaves the body's generator suspended until the garbage collector finds it, and the engine generating on
    meanwhile (the whole request, for a large one)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
