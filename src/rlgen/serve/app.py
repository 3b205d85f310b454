"""The HTTP API of `rlgen serve` (FastAPI). Token-in/token-out generation spread over the data-parallel engines,
an OpenAI-style /v1/completions for text, weight updates (safetensors over HTTP, or vLLM's NCCL weight transfer
driven by the trainer), sleep/wake and pause/resume. Every completion carries the policy version that made it.

Errors are JSON ``{"error": "<one sentence with the fix>"}`` with a 4xx/5xx status. No `from __future__ import
annotations` here: FastAPI reads the handlers' annotations, which name classes imported inside make_app."""


import hmac
import json
from typing import Any

from rlgen.serve.openai import completions_request, completions_response
from rlgen.serve.pool import EnginePool
from rlgen.wire.protocol import BadRequest, completion_to_json, request_from_json, weights_from_bytes

OPEN_PATHS = {"/health"}  # answered without a token, for load balancers and readiness probes


def _engine_arg(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as err:
        raise BadRequest(f"engine={value!r} must be an engine index.") from err


def make_app(pool: EnginePool, *, token: str | None, max_sequences: int, max_body_mb: float) -> Any:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="rlgen serve", docs_url=None, redoc_url=None, openapi_url=None)
    max_body = int(max_body_mb * 2**20)

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        if token and request.url.path not in OPEN_PATHS:
            sent = request.headers.get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                return JSONResponse({"error": "missing or wrong bearer token: send 'Authorization: Bearer <token>' "
                                              "(rlgen's client reads RLGEN_SERVE_TOKEN or engine.token)."}, 401)
        size = int(request.headers.get("content-length") or 0)
        if request.url.path != "/weights" and size > max_body:
            return JSONResponse({"error": too_large(size)}, 413)
        try:
            return await call_next(request)
        except BadRequest as err:
            return JSONResponse({"error": str(err)}, err.status)
        except Exception as err:  # noqa: BLE001 - an engine's failure becomes one line for the client
            from rlgen.runtime.waits import short

            return JSONResponse({"error": f"the engines failed: {short(getattr(err, 'cause', None) or err)}"}, 500)

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, err: BadRequest) -> Any:
        return JSONResponse({"error": str(err)}, err.status)

    def too_large(size: int) -> str:
        return (f"the request body is {size / 2**20:.1f} MiB, over serve.max_body_mb={max_body_mb:g}; send fewer "
                "prompts per request.")

    async def body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > max_body:  # a chunked body has no Content-Length to refuse it by
            raise BadRequest(too_large(len(raw)), status=413)
        try:
            data = json.loads(raw)
        except ValueError as err:
            raise BadRequest(f"the body is not JSON ({err}).") from err
        if not isinstance(data, dict):
            raise BadRequest("the body must be a JSON object.")
        return data

    def check_count(n: int) -> None:
        if n > max_sequences:
            raise BadRequest(f"the request asks for {n} sequences (prompts x n), over serve.max_sequences="
                             f"{max_sequences}; split it into smaller requests.", status=413)

    @app.get("/health")
    async def health() -> Any:
        h = await pool.health()
        return JSONResponse(h, 200 if h["ok"] else 503)

    @app.get("/info")
    async def info() -> Any:
        return pool.info()

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        data = await body(request)
        raw = data.get("requests")
        if not isinstance(raw, list) or not raw:
            raise BadRequest("the body needs 'requests': a non-empty list of {prompt_ids, n, max_tokens, ...}.")
        m = pool.model
        reqs = [request_from_json(r, i, m.vocab_size, m.max_model_len) for i, r in enumerate(raw)]
        check_count(sum(r.sampling.n for r in reqs))
        out = await pool.generate(reqs, _engine_arg(data.get("engine")))
        out["completions"] = [completion_to_json(c) for c in out["completions"]]
        return out

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        data = await body(request)
        m = pool.model
        reqs, stops = completions_request(data, m)
        check_count(sum(r.sampling.n for r in reqs))
        out = await pool.generate(reqs)
        return completions_response(out["completions"], reqs, stops, m, bool(data.get("logprobs") is not None))

    @app.post("/weights")
    async def weights(request: Request, version: int, engine: int | None = None) -> Any:
        blob = await request.body()
        return await pool.update_weights(weights_from_bytes(blob), version, engine)

    @app.post("/weight_transfer/init")
    async def transfer_init(request: Request) -> Any:
        data = await body(request)
        results = await pool.init_weight_transfer(dict(data.get("init_info") or {}), float(data.get("timeout_s", 300)),
                                                  _engine_arg(data.get("engine")))
        return {"results": results}

    @app.post("/weight_transfer/receive")
    async def transfer_receive(request: Request) -> Any:
        data = await body(request)
        if "update_info" not in data or "version" not in data:
            raise BadRequest("the body needs update_info and version.")
        return await pool.receive_weights(dict(data["update_info"]), int(data["version"]),
                                          float(data.get("timeout_s", 300)), _engine_arg(data.get("engine")))

    @app.post("/sleep")
    async def sleep(request: Request) -> Any:
        data = await body(request)
        return await pool.sleep(int(data.get("level", 1)), _engine_arg(data.get("engine")))

    @app.post("/wake")
    async def wake(request: Request) -> Any:
        data = await body(request)
        return await pool.wake(data.get("tags"), _engine_arg(data.get("engine")))

    @app.post("/pause")
    async def pause(request: Request) -> Any:
        data = await body(request)
        return await pool.pause(_engine_arg(data.get("engine")))

    @app.post("/resume")
    async def resume(request: Request) -> Any:
        data = await body(request)
        return await pool.resume(_engine_arg(data.get("engine")))

    return app
