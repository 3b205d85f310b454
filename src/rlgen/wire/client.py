"""Clients of `rlgen serve`: ``GenerationClient`` (blocking) and ``AsyncGenerationClient`` (asyncio), with the
same methods. Generate token-in/token-out, push weights, and drive sleep/wake and pause/resume from your own
training loop::

    with GenerationClient("http://127.0.0.1:8000") as client:
        out = client.generate_ids([[1, 2, 3]], n=4, max_tokens=32, temperature=1.0)

The bearer token comes from ``token=`` or RLGEN_SERVE_TOKEN. Every call has a timeout; a server that is down or
refuses a request raises ``ServerError`` with its one-sentence reason. docs/serve.md has a longer example.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlgen.generated import GenResult
from rlgen.types import Completion, GenRequest, SamplingParams
from rlgen.wire.protocol import (
    TOKEN_ENV,
    adapter_to_bytes,
    chunks,
    error_message,
    request_to_json,
    weights_to_bytes,
)


class ServerError(RuntimeError):
    """The server could not be reached or refused the call; ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass
class Generation:
    completions: list[Completion]  # n per request, in request order
    version: int  # the newest policy version among the engines that answered
    spans: list[dict[str, Any]] = field(default_factory=list)  # per engine: phase, start, end (server clock)


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    json: Any = None
    content: bytes | None = None
    params: dict[str, Any] | None = None
    parse: Any = None  # the JSON answer -> the method's return value
    timeout_s: float | None = None


def _generation(d: dict[str, Any]) -> Generation:
    """The /generate answer: its completions and version read as an engine's result, its spans as they came."""
    res = GenResult.from_json(d)
    return Generation(res.completions, res.version, list(d.get("spans", [])))


def _engine(engine: int | None) -> dict[str, Any]:
    return {} if engine is None else {"engine": int(engine)}


class _Calls:
    """Each public method as a _Call; the two clients only differ in how they send it."""

    @staticmethod
    def generate(requests: Sequence[GenRequest], engine: int | None = None) -> _Call:
        return _Call("POST", "/generate", {"requests": [request_to_json(r) for r in requests], **_engine(engine)},
                     parse=_generation)

    @staticmethod
    def generate_ids(prompts: Sequence[Sequence[int]], *, n: int = 1, max_tokens: int = 16, temperature: float = 1.0,
                     top_p: float = 1.0, stop_token_ids: Sequence[int] = (), seed: int | None = None,
                     ignore_eos: bool = False, adapter: str | None = None) -> _Call:
        sampling = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_tokens,
                                  stop_token_ids=tuple(stop_token_ids), ignore_eos=ignore_eos, seed=seed)
        return _Calls.generate([GenRequest(tuple(p), sampling, i, adapter) for i, p in enumerate(prompts)])

    @staticmethod
    def complete(prompt: str | list[str], **kwargs: Any) -> _Call:
        return _Call("POST", "/v1/completions", {"prompt": prompt, **kwargs})

    @staticmethod
    def update_weights(weights: Mapping[str, Any] | Iterable[tuple[str, Any]], version: int,
                       engine: int | None = None) -> _Call:
        return _Call("POST", "/weights", content=weights_to_bytes(weights),
                     params={"version": int(version), **_engine(engine)})

    @staticmethod
    def update_adapter(adapter: Mapping[str, Any], version: int, engine: int | None = None) -> _Call:
        """A LoRA learner's adapter ({"tensors", "config"}) becomes the server's policy at ``version``."""
        return _Call("POST", "/weights/adapter", content=adapter_to_bytes(adapter),
                     params={"version": int(version), **_engine(engine)})

    @staticmethod
    def load_lora_adapter(name: str, path: str, load_inplace: bool = False) -> _Call:
        """Load the adapter folder at path (on the server's machine) under ``name``."""
        return _Call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path,
                                                       "load_inplace": bool(load_inplace)})

    @staticmethod
    def unload_lora_adapter(name: str) -> _Call:
        return _Call("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    @staticmethod
    def init_weight_transfer(init_info: dict[str, Any], timeout_s: float = 300.0, engine: int | None = None) -> _Call:
        return _Call("POST", "/weight_transfer/init", {"init_info": init_info, "timeout_s": timeout_s,
                                                       **_engine(engine)}, timeout_s=timeout_s + 60)

    @staticmethod
    def receive_weights(update_info: dict[str, Any], version: int, timeout_s: float = 300.0,
                        engine: int | None = None) -> _Call:
        return _Call("POST", "/weight_transfer/receive", {"update_info": update_info, "version": int(version),
                                                          "timeout_s": timeout_s, **_engine(engine)},
                     timeout_s=timeout_s + 60)

    @staticmethod
    def sleep(level: int = 1, engine: int | None = None) -> _Call:
        return _Call("POST", "/sleep", {"level": level, **_engine(engine)})

    @staticmethod
    def wake(tags: list[str] | None = None, engine: int | None = None) -> _Call:
        return _Call("POST", "/wake", {"tags": tags, **_engine(engine)})

    @staticmethod
    def pause(engine: int | None = None) -> _Call:
        return _Call("POST", "/pause", _engine(engine))

    @staticmethod
    def resume(engine: int | None = None) -> _Call:
        return _Call("POST", "/resume", _engine(engine))

    @staticmethod
    def health() -> _Call:
        return _Call("GET", "/health")

    @staticmethod
    def info() -> _Call:
        return _Call("GET", "/info")


METHODS = [name for name in vars(_Calls) if not name.startswith("_")]


def _headers(token: str | None) -> dict[str, str]:
    token = token or os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _send_args(call: _Call, *, asynchronous: bool = False) -> dict[str, Any]:
    args: dict[str, Any] = {"json": call.json, "params": call.params}
    if call.content is not None:  # a weight blob goes in pieces, with its length up front
        pieces = chunks(call.content)
        args["headers"] = {"content-length": str(len(call.content))}
        if asynchronous:
            async def stream() -> Any:
                for piece in pieces:
                    yield piece

            args["content"] = stream()
        else:
            args["content"] = pieces
    if call.timeout_s is not None:  # else the client's own
        args["timeout"] = call.timeout_s
    return args


def _answer(response: Any, call: _Call, url: str) -> Any:
    if response.status_code >= 400:
        try:
            why = error_message(response.json()) or response.text
        except ValueError:
            why = response.text or response.reason_phrase
        raise ServerError(f"{call.path} at {url}: {why}", response.status_code)
    data = response.json()
    return call.parse(data) if call.parse else data


def _no_answer(err: Exception, call: _Call, url: str) -> ServerError:
    return ServerError(f"no answer from the rlgen server at {url} to {call.path} ({type(err).__name__}: {err}); "
                       "check that `rlgen serve` is running there, or fix the URL.")


class GenerationClient:
    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 600.0):
        import httpx

        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=_headers(token), timeout=timeout_s)

    def _do(self, call: _Call) -> Any:
        import httpx

        try:
            response = self._http.request(call.method, call.path, **_send_args(call))
        except httpx.HTTPError as err:
            raise _no_answer(err, call, self.url) from err
        return _answer(response, call, self.url)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GenerationClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncGenerationClient:
    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 600.0):
        import httpx

        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.url, headers=_headers(token), timeout=timeout_s)

    async def _do(self, call: _Call) -> Any:
        import httpx

        try:
            response = await self._http.request(call.method, call.path, **_send_args(call, asynchronous=True))
        except httpx.HTTPError as err:
            raise _no_answer(err, call, self.url) from err
        return _answer(response, call, self.url)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncGenerationClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _bind(name: str) -> None:
    build = getattr(_Calls, name)

    def sync(self: GenerationClient, *args: Any, **kwargs: Any) -> Any:
        return self._do(build(*args, **kwargs))

    async def run(self: AsyncGenerationClient, *args: Any, **kwargs: Any) -> Any:
        return await self._do(build(*args, **kwargs))

    for fn, cls in ((sync, GenerationClient), (run, AsyncGenerationClient)):
        functools.update_wrapper(fn, build)  # help() and inspect show the call's own signature
        setattr(cls, name, fn)


for _name in METHODS:
    _bind(_name)

__all__ = ["AsyncGenerationClient", "Generation", "GenerationClient", "ServerError"]
