"""`rlgen serve` under load, on a real socket (uvicorn in a thread, in-process hf engines): a body over the limit is
refused as it arrives (chunked too), a client that stalls mid-body gets 408, a full queue gets 429 with Retry-After,
/metrics speaks Prometheus' text format, and the server stays healthy after each."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from helpers import serve_in_thread, tiny_pool
from rlgen.serve.app import make_app

pytest.importorskip("prometheus_client")

PROMPT = [5, 6, 7, 8]


ENGINES: list = []


@pytest.fixture(scope="module")
def url():
    pool = tiny_pool(1)
    ENGINES.extend(pool.engines)
    app = make_app(pool, token=None, max_sequences=4096, max_body_mb=1.0, max_queue=1, body_timeout_s=0.5)
    with serve_in_thread(app) as address:
        yield address


def _healthy(url: str) -> None:
    assert httpx.get(f"{url}/health", timeout=10).json()["ok"]


def _stalled(url: str, head: bytes, body: bytes) -> socket.socket:
    """A connection that sent head and part of a body, then nothing more."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + head + b"\r\n" + body)
    return s


def _answer(s: socket.socket) -> str:
    """The status line, headers and body of one HTTP answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += s.recv(65536)
    return (head + b"\r\n\r\n" + body).decode()


def test_a_chunked_body_is_refused_as_it_arrives(url):
    """2 MiB of a chunked body, then the client stalls: a server that waited for the whole body would answer 408
    (stalled); this one answers 413 as soon as the limit is passed."""
    chunk = b"x" * 2**20
    piece = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    with _stalled(url, b"Transfer-Encoding: chunked\r\n", piece * 2) as s:
        answer = _answer(s)
    assert answer.startswith("HTTP/1.1 413") and "over serve.max_body_mb=1" in answer
    _healthy(url)


def test_a_client_that_stalls_mid_body_gets_408(url):
    t0 = time.time()
    with _stalled(url, b"Content-Length: 500\r\n", b'{"requests": [') as s:
        answer = _answer(s)
    assert answer.startswith("HTTP/1.1 408") and "serve.body_timeout_s" in answer
    assert time.time() - t0 < 10
    _healthy(url)


def test_a_full_queue_gets_429_with_retry_after(url):
    # a stalled body holds the only place (serve.max_queue=1) until it times out
    with _stalled(url, b"Content-Length: 500\r\n", b'{"requests": [') as s:
        second = httpx.post(f"{url}/generate", json={"requests": [{"prompt_ids": PROMPT}]}, timeout=60)
        assert _answer(s).startswith("HTTP/1.1 408")
    assert second.status_code == 429 and second.headers["Retry-After"] == "1"
    assert "serve.max_queue" in second.json()["error"]["message"]
    assert httpx.post(f"{url}/generate", json={"requests": [{"prompt_ids": PROMPT}]}, timeout=60).status_code == 200
    _healthy(url)


def test_metrics_in_prometheus_text_format(url):
    httpx.post(f"{url}/generate", json={"requests": [{"prompt_ids": PROMPT, "max_tokens": 4, "ignore_eos": True}]},
               timeout=60)
    r = httpx.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in ('rlgen_requests_total{route="/generate",status="200"}', "rlgen_request_seconds_bucket",
                 "rlgen_queue_depth 0.0", "rlgen_queue_limit 1.0", "rlgen_completion_tokens_total"):
        assert line in text, line
    tokens = next(float(x.split()[-1]) for x in text.splitlines() if x.startswith("rlgen_completion_tokens_total"))
    assert tokens >= 4


def test_a_client_that_disconnects_stops_its_generation(url):
    """A stream of 100 tokens, left after its first chunk: the engine generates a few more steps, not the rest
    (its count of generated tokens tells), and the server answers the next request."""
    engine = ENGINES[0]
    before = engine.tokens
    body = {"prompt": PROMPT, "max_tokens": 100, "stream": True, "logit_bias": {"1": -100}, "temperature": 1.0}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and next(r.iter_lines()).startswith("data: ")
    deadline = time.time() + 10
    while time.time() < deadline and httpx.get(f"{url}/metrics", timeout=10).text.count("rlgen_queue_depth 0.0") == 0:
        time.sleep(0.1)
    time.sleep(0.5)
    assert engine.tokens - before < 100, "the generation ran to its end after the client left"
    assert "rlgen_queue_depth 0.0" in httpx.get(f"{url}/metrics", timeout=10).text  # its place was released
    _healthy(url)
    full = httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, timeout=60).json()
    assert full["usage"]["completion_tokens"] == 100
