"""The HTTP API of `rlgen serve` (FastAPI). Token-in/token-out generation spread over the data-parallel engines,
an OpenAI-style /v1/completions for text, weight updates (safetensors over HTTP, or vLLM's NCCL weight transfer
driven by the trainer), LoRA adapters (loaded and unloaded by name, or a trainer's policy adapter), sleep/wake
and pause/resume. Every completion carries the policy version that made it.

Errors are in OpenAI's shape, ``{"error": {"message": "<one sentence with the fix>", "type", "code"}}``, with a
4xx/5xx status, on every route (an unknown one included). The handlers are plain
module functions; what they share (the engine pool and the server's limits) is a ServeState on ``app.state.serve``.
No `from __future__ import annotations` here: FastAPI reads the handlers' annotations at run time."""


import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from rlgen.generated import completion_to_json
from rlgen.serve.http import CLIENT_GONE, ClientGone, failure, unless_disconnected
from rlgen.serve.http import body as _body
from rlgen.serve.http import engine_arg as _engine_arg
from rlgen.serve.http import state as _state
from rlgen.serve.load import RETRY_AFTER_S, ROUTE_NAMES, Load
from rlgen.serve.lora import load_named, unload_named, update_policy
from rlgen.serve.openai import (
    Shape,
    chat_request,
    chat_response,
    completions_request,
    completions_response,
    model_response,
    models_response,
)
from rlgen.serve.pool import EnginePool
from rlgen.serve.stream import Chunks, ClosingStream, sse
from rlgen.serve.vllm_api import ROUTES as VLLM_ROUTES
from rlgen.wire.protocol import (
    BadRequest,
    adapter_from_bytes,
    error_body,
    request_from_json,
    weights_from_bytes,
)

OPEN_PATHS = {"/health"}  # answered without a token, for load balancers and readiness probes
TRANSFER_TIMEOUT_S = 300  # an NCCL weight transfer's default wait, when the trainer sends none


@dataclass(frozen=True)
class ServeState:
    """What the handlers share: the engines and the limits `rlgen serve` was started with."""

    pool: EnginePool
    token: str | None
    max_sequences: int
    max_body_mb: float
    load: Load
    body_timeout_s: float

    @property
    def max_body(self) -> int:
        return int(self.max_body_mb * 2**20)

    def too_large(self, size: int) -> str:
        return (f"the request body is {size / 2**20:.1f} MiB, over serve.max_body_mb={self.max_body_mb:g}; send "
                "fewer prompts per request.")

    def check_count(self, n: int) -> None:
        if n > self.max_sequences:
            raise BadRequest(f"the request asks for {n} sequences (prompts x n), over serve.max_sequences="
                             f"{self.max_sequences}; split it into smaller requests.", status=413)


# -- middleware and errors ---------------------------------------------------------------------------------
async def guard(request: Request, call_next: Any) -> Any:
    """The bearer token and the body limit before any route; a route's failure as one JSON sentence."""
    state = _state(request)
    if state.token and request.url.path not in OPEN_PATHS:
        sent = request.headers.get("authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {state.token}".encode()):
            return _error("missing or wrong bearer token: send 'Authorization: Bearer <token>' (rlgen's client reads "
                          "RLGEN_SERVE_TOKEN or engine.token).", 401)
    size = int(request.headers.get("content-length") or 0)
    if not request.url.path.startswith("/weights") and size > state.max_body:
        return _error(state.too_large(size), 413)
    path, t0 = request.url.path, time.perf_counter()
    full = state.load.admit(path)
    if full:
        return JSONResponse(error_body(full, 429), 429, headers={"Retry-After": str(RETRY_AFTER_S)})
    response = None
    try:
        response = await call_next(request)
    except BadRequest as err:
        response = _error(str(err), err.status)
    except ClientGone:
        response = Response(status_code=CLIENT_GONE)  # counted in /metrics; the client is not there to read it
    except Exception as err:  # noqa: BLE001 - an engine's failure becomes one line for the client
        response = _error(f"the engines failed: {failure(err)}", 500)
    finally:
        state.load.done(path, response.status_code if response is not None else 500, time.perf_counter() - t0,
                        release=not (response is not None and getattr(request.state, "streaming", False)))
    return response


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse(error_body(message, status), status)


async def bad_request(_: Request, err: BadRequest) -> Any:
    return _error(str(err), err.status)


async def http_error(request: Request, err: HTTPException) -> Any:
    """Starlette's own errors (a route that does not exist, a wrong method) in the same shape."""
    if err.status_code == 404:
        return _error(f"{request.url.path} is not a route of rlgen serve; its routes are listed in docs/serve.md "
                      "(GET /info answers for a running server).", 404)
    if err.status_code == 405:
        return _error(f"{request.method} is not allowed on {request.url.path}.", 405)
    return _error(str(err.detail), err.status_code)


# -- state and generation ----------------------------------------------------------------------------------
async def health(request: Request) -> Any:
    h = await _state(request).pool.health()
    return JSONResponse(h, 200 if h["ok"] else 503)


async def info(request: Request) -> Any:
    return _state(request).pool.info()


async def metrics(request: Request) -> Any:
    body, media_type = _state(request).load.exposition()
    return Response(body, media_type=media_type)


async def generate(request: Request) -> Any:
    state = _state(request)
    data = await _body(request)
    raw = data.get("requests")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("the body needs 'requests': a non-empty list of {prompt_ids, n, max_tokens, ...}.")
    m = state.pool.model
    reqs = [request_from_json(r, i, m.vocab_size, m.max_model_len) for i, r in enumerate(raw)]
    state.check_count(sum(r.sampling.n for r in reqs))
    out = await unless_disconnected(request, state.pool.generate(reqs, _engine_arg(data.get("engine"))))
    out["completions"] = [completion_to_json(c) for c in out["completions"]]
    return out


async def _openai(request: Request, parse: Callable[..., Any], answer: Callable[..., Any], chat: bool) -> Any:
    """An OpenAI completion route: the body parsed into requests, answered whole or streamed."""
    state = _state(request)
    data = await _body(request)
    m = state.pool.model
    reqs, stops = parse(data, m, state.pool.adapters)
    state.check_count(sum(r.sampling.n for r in reqs))
    shape = Shape.of(data, chat)
    if data.get("stream"):
        return await _streamed(request, data, reqs, Chunks(reqs, stops, m, chat, shape))
    out = await unless_disconnected(request, state.pool.generate(reqs))
    return answer(out["completions"], reqs, stops, m, shape)


async def completions(request: Request) -> Any:
    return await _openai(request, completions_request, completions_response, chat=False)


async def chat_completions(request: Request) -> Any:
    return await _openai(request, chat_request, chat_response, chat=True)


async def _streamed(request: Request, data: dict[str, Any], reqs: list, chunks: Chunks) -> Any:
    """A generation answered as server-sent events; its place in the queue is released when the stream ends."""
    state = _state(request)
    await state.pool.ready(reqs, None)  # an asleep engine or unknown adapter is refused before the stream starts
    request.state.streaming = True
    usage = bool((data.get("stream_options") or {}).get("include_usage"))
    return ClosingStream(sse(state.pool.generate_stream(reqs), chunks, usage, state.load.release),
                         media_type="text/event-stream")


async def models(request: Request) -> Any:
    pool = _state(request).pool
    return models_response(pool.model, pool.adapters, pool.started)


async def model(request: Request, model_id: str) -> Any:
    pool = _state(request).pool
    return model_response(pool.model, pool.adapters, pool.started, model_id)


# -- weights -----------------------------------------------------------------------------------------------
async def weights(request: Request, version: int, engine: int | None = None) -> Any:
    blob = await request.body()
    return await _state(request).pool.update_weights(weights_from_bytes(blob), version, engine)


async def transfer_init(request: Request) -> Any:
    data = await _body(request)
    results = await _state(request).pool.init_weight_transfer(
        dict(data.get("init_info") or {}), float(data.get("timeout_s", TRANSFER_TIMEOUT_S)),
        _engine_arg(data.get("engine")))
    return {"results": results}


async def transfer_receive(request: Request) -> Any:
    data = await _body(request)
    if "update_info" not in data or "version" not in data:
        raise BadRequest("the body needs update_info and version.")
    return await _state(request).pool.receive_weights(
        dict(data["update_info"]), int(data["version"]), float(data.get("timeout_s", TRANSFER_TIMEOUT_S)),
        _engine_arg(data.get("engine")))


# -- LoRA adapters (rlgen.serve.lora) ----------------------------------------------------------------------
LOAD_FIELDS = {"lora_name", "lora_path", "load_inplace"}


async def load_lora_adapter(request: Request) -> Any:
    data = await _body(request)
    unknown = sorted(set(data) - LOAD_FIELDS)
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; send lora_name, lora_path and optionally load_inplace.")
    name, path = data.get("lora_name"), data.get("lora_path")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise BadRequest("the body needs lora_name (the name requests will use) and lora_path (an adapter folder on "
                         "the server's machine).")
    return await load_named(_state(request).pool, name, path, data.get("load_inplace") is True)


async def unload_lora_adapter(request: Request) -> Any:
    data = await _body(request)
    name = data.get("lora_name")
    if not isinstance(name, str) or not name:
        raise BadRequest("the body needs lora_name, the adapter to unload.")
    return await unload_named(_state(request).pool, name)


async def policy_adapter(request: Request, version: int, engine: int | None = None) -> Any:
    blob = await request.body()
    return await update_policy(_state(request).pool, adapter_from_bytes(blob), version, engine)


# -- memory and scheduling ---------------------------------------------------------------------------------
async def sleep(request: Request) -> Any:
    data = await _body(request)
    return await _state(request).pool.sleep(int(data.get("level", 1)), _engine_arg(data.get("engine")))


async def wake(request: Request) -> Any:
    data = await _body(request)
    return await _state(request).pool.wake(data.get("tags"), _engine_arg(data.get("engine")))


async def pause(request: Request) -> Any:
    data = await _body(request)
    return await _state(request).pool.pause(_engine_arg(data.get("engine")))


async def resume(request: Request) -> Any:
    data = await _body(request)
    return await _state(request).pool.resume(_engine_arg(data.get("engine")))


ROUTES: list[tuple[str, str, Callable[..., Any]]] = [
    ("GET", "/health", health),
    ("GET", "/info", info),
    ("GET", "/metrics", metrics),
    ("POST", "/generate", generate),
    ("POST", "/v1/completions", completions),
    ("POST", "/v1/chat/completions", chat_completions),
    ("GET", "/v1/models", models),
    ("GET", "/v1/models/{model_id:path}", model),  # an id may hold slashes (a model folder's path)
    ("POST", "/weights", weights),
    ("POST", "/weights/adapter", policy_adapter),
    ("POST", "/v1/load_lora_adapter", load_lora_adapter),
    ("POST", "/v1/unload_lora_adapter", unload_lora_adapter),
    ("POST", "/weight_transfer/init", transfer_init),
    ("POST", "/weight_transfer/receive", transfer_receive),
    ("POST", "/sleep", sleep),
    ("POST", "/wake", wake),
    ("POST", "/pause", pause),
    ("POST", "/resume", resume),
    *VLLM_ROUTES,  # vLLM's server's own routes that RL trainers (TRL's VLLMClient) call
]


def make_app(pool: EnginePool, *, token: str | None, max_sequences: int, max_body_mb: float, max_queue: int = 256,
             body_timeout_s: float = 30.0) -> FastAPI:
    """The server's app over ``pool``: every route in ROUTES, behind the token, body-size and queue guard."""
    app = FastAPI(title="rlgen serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = ServeState(pool, token, max_sequences, max_body_mb, Load(pool, max_queue), body_timeout_s)
    ROUTE_NAMES.update(path for _, path, _ in ROUTES)
    app.middleware("http")(guard)
    app.add_exception_handler(BadRequest, bad_request)
    app.add_exception_handler(HTTPException, http_error)
    for method, path, handler in ROUTES:
        app.add_api_route(path, handler, methods=[method])
    return app
