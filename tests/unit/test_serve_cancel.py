"""Abandoned work stops using the engines, on a real socket (uvicorn in a thread, an in-process hf engine slowed to
20 ms a step, so a 100-token answer takes about 2 s): a non-streamed request whose client disconnects, and one
that outlives serve.request_timeout_s, each stop the engine's generation at its next step (the engine's count of
generated tokens tells); a client that trickles its headers gets 408 after serve.header_timeout_s, and an idle
connection is closed. The server stays healthy after each."""

from __future__ import annotations

import gc
import json
import socket
import time

import httpx
import pytest

from helpers import serve_in_thread, tiny_pool
from rlgen.serve.app import make_app

pytest.importorskip("prometheus_client")

STEP_S = 0.02
TOKENS = 100
BODY = {"prompt": [5, 6, 7, 8], "max_tokens": TOKENS, "logit_bias": {"1": -100}, "temperature": 1.0}


@pytest.fixture(scope="module")
def served():
    pool = tiny_pool(1, timeout_s=1.0)
    engine = pool.engines[0]
    engine.model.register_forward_pre_hook(lambda *_: time.sleep(STEP_S))
    app = make_app(pool, token=None, max_sequences=64, max_body_mb=1.0)
    with serve_in_thread(app, header_timeout_s=0.5) as url:
        yield url, engine


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _generated_after(engine, before: int, timeout_s: float = 10.0) -> int:
    """The tokens the engine generated since ``before``, once its call has ended (it counts them at the end)."""
    deadline = time.time() + timeout_s
    while engine.tokens == before and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(4 * STEP_S)
    return engine.tokens - before


def _metric(url: str, line: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)), 0.0)


def _healthy(url: str) -> None:
    assert httpx.get(f"{url}/health", timeout=10).json()["ok"]


def test_the_engine_is_slow_enough_to_tell(served):
    """The baseline the tests below rely on: a whole answer takes many steps, and all its tokens are counted."""
    url, engine = served
    before = engine.tokens
    with httpx.Client(timeout=30) as c:
        r = c.post(f"{url}/v1/completions", json={**BODY, "max_tokens": 20})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 20
    assert engine.tokens - before == 20


def test_a_disconnect_cancels_a_non_streamed_generation(served):
    url, engine = served
    before, gone = engine.tokens, _metric(url, 'rlgen_requests_total{route="/v1/completions",status="499"}')
    body = json.dumps(BODY).encode()
    with _connect(url) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.3)  # generating by now
    generated = _generated_after(engine, before)
    assert 0 < generated < TOKENS, f"{generated} tokens: the generation ran on after its client left"
    assert _metric(url, 'rlgen_requests_total{route="/v1/completions",status="499"}') == gone + 1
    assert _metric(url, "rlgen_queue_depth") == 0  # its place in the queue was released
    _healthy(url)


def test_a_disconnect_cancels_a_streamed_generation_at_once():
    """A client that leaves a large stream after its first chunk: the server is busy sending that step's chunks
    when it notices, so the stream is left at a chunk, not while waiting for the engine. Its generation stops at
    the engine's next steps, and its place in the queue is released, without waiting for the garbage collector
    (off here, as it is between its runs), which before left the engine generating the whole request."""
    prompts, tokens = 256, 100
    pool = tiny_pool(1)
    engine = pool.engines[0]
    body = json.dumps({**BODY, "prompt": [[5, 6, 7, 8]] * prompts, "stream": True}).encode()
    with serve_in_thread(make_app(pool, token=None, max_sequences=prompts, max_body_mb=1.0)) as url:
        gc.disable()
        try:
            with _connect(url) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                answer = b""
                while b"data: " not in answer:
                    answer += s.recv(65536)
            generated = _generated_after(engine, 0)
            deadline = time.time() + 5
            while _metric(url, "rlgen_queue_depth") and time.time() < deadline:
                time.sleep(0.05)
            depth = _metric(url, "rlgen_queue_depth")
        finally:
            gc.enable()
        assert answer.startswith(b"HTTP/1.1 200")
        assert generated < prompts * tokens // 4, f"{generated} tokens: the generation ran on after its client left"
        assert depth == 0
        _healthy(url)


def test_a_request_that_times_out_stops_its_generation(served):
    url, engine = served
    before = engine.tokens
    r = httpx.post(f"{url}/generate", json={"requests": [{"prompt_ids": [5, 6, 7, 8], "max_tokens": TOKENS,
                                                           "ignore_eos": True}]}, timeout=30)
    assert r.status_code == 504 and "serve.request_timeout_s" in r.json()["error"]["message"]
    generated = _generated_after(engine, before)
    assert 0 < generated < TOKENS, f"{generated} tokens: the generation ran on after its request timed out"
    _healthy(url)


def test_headers_sent_a_byte_at_a_time_get_408(served):
    url, _ = served
    t0 = time.time()
    with _connect(url) as s:
        head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        answer = b""
        for i in range(len(head)):  # one byte every 50 ms: 3.4 s for the whole head, were it let through
            try:
                s.sendall(head[i : i + 1])
            except OSError:
                break
            time.sleep(0.05)
            s.setblocking(False)
            try:
                answer += s.recv(4096)
            except BlockingIOError:
                pass
            finally:
                s.setblocking(True)
            if answer:
                break
        s.settimeout(5)
        while b"}" not in answer:
            more = s.recv(4096)
            if not more:
                break
            answer += more
    assert answer.startswith(b"HTTP/1.1 408") and b"serve.header_timeout_s" in answer, answer
    assert time.time() - t0 < 2
    _healthy(url)


def test_an_idle_connection_is_closed_without_an_answer(served):
    url, _ = served
    with _connect(url) as s:
        s.settimeout(5)
        t0 = time.time()
        assert s.recv(4096) == b""  # closed by the server, nothing sent
        assert time.time() - t0 < 3


def test_a_kept_alive_connection_serves_requests_slower_than_the_header_limit(served):
    """The header limit is per request: a connection that asks again after a pause longer than it still gets
    its answers, each request's headers arriving whole."""
    url, _ = served
    with httpx.Client(timeout=30) as c:
        assert c.get(f"{url}/health").status_code == 200
        time.sleep(0.8)
        assert c.get(f"{url}/health").status_code == 200
