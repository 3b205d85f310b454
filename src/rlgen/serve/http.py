"""What every route of `rlgen serve` reads from its request: the server's shared state, the JSON body (within
serve.max_body_mb and serve.body_timeout_s; an empty body is an empty object) and an engine index; an engine's
failure as the one line a client gets; and work that stops when its client disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Request

from rlgen.runtime.cluster.waits import short
from rlgen.serve.load import read_body
from rlgen.wire.protocol import BadRequest

T = TypeVar("T")
CLIENT_GONE = 499  # the status a request whose client disconnected is counted with (nobody reads it)


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its work was cancelled."""


def state(request: Request) -> Any:
    """The app's ServeState (rlgen.serve.app)."""
    return request.app.state.serve


def failure(err: BaseException) -> str:
    """An engine's failure in one line: the cause a Ray task error carries, else the error."""

    return short(getattr(err, "cause", None) or err)


def engine_arg(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as err:
        raise BadRequest(f"engine={value!r} must be an engine index.") from err


async def body(request: Request) -> dict[str, Any]:
    """The request's JSON object, within serve.max_body_mb; {} for an empty body."""
    s = state(request)
    raw = await read_body(request, s.max_body, s.body_timeout_s,
                          f"the request body is over serve.max_body_mb={s.max_body_mb:g}; send fewer prompts per "
                          "request.")
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as err:
        raise BadRequest(f"the body is not JSON ({err}).") from err
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object.")
    return data


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """work's result, or ClientGone once the client disconnects first: work is then cancelled, and the engine
    calls under it stop generating (EnginePool.call). The body must have been read: what the client sends next
    can only be its disconnect."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # its engine calls are told to stop before this returns
    if task.cancelled():
        raise ClientGone
    return task.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
