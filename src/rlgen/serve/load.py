"""What keeps `rlgen serve` standing under load: a bounded number of generation requests (more get 429 with
Retry-After), request bodies read within a byte limit and a time limit as they arrive (chunked ones included),
and the server's numbers in Prometheus' text format (``GET /metrics``, through prometheus_client): requests by
route and status, latencies, requests waiting or running, sequences and tokens generated, weight updates."""

from __future__ import annotations

import asyncio
from typing import Any

from rlgen.wire.protocol import BadRequest

GENERATION_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")
RETRY_AFTER_S = 1


class Load:
    """The server's load: generation requests admitted now, and the Prometheus metrics."""

    def __init__(self, pool: Any, max_queue: int):
        self.pool, self.max_queue = pool, int(max_queue)
        self.active = 0  # generation requests waiting for or running on the engines
        self.registry: Any = None
        self._latency: Any = None
        self._requests: Any = None
        try:
            self._metrics()
        except ImportError:  # registry stays None: /metrics then says how to get it; nothing else needs it
            pass

    def _metrics(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.registry = CollectorRegistry()
        self._requests = Counter("rlgen_requests", "HTTP requests answered, by route and status",
                                 ["route", "status"], registry=self.registry)
        self._latency = Histogram("rlgen_request_seconds", "time to answer a request, by route", ["route"],
                                  buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
                                  registry=self.registry)
        load = self

        class PoolState:  # read from the pool when scraped
            def collect(self) -> Any:
                p = load.pool
                yield GaugeMetricFamily("rlgen_queue_depth", "generation requests waiting or running", value=load.active)
                yield GaugeMetricFamily("rlgen_queue_limit", "serve.max_queue", value=load.max_queue)
                yield GaugeMetricFamily("rlgen_engine_calls_in_flight", "engine calls under way", value=sum(p.in_flight))
                for name, value, text in (("rlgen_generation_requests", p.requests, "generation requests served"),
                                          ("rlgen_sequences", p.sequences, "sequences generated"),
                                          ("rlgen_completion_tokens", p.tokens, "tokens generated"),
                                          ("rlgen_weight_updates", p.updates, "weight and adapter updates")):
                    yield CounterMetricFamily(name, text, value=value)

        self.registry.register(PoolState())

    def admit(self, path: str) -> str | None:
        """Count a request in; a sentence (for a 429) when a generation request finds the queue full."""
        if path not in GENERATION_ROUTES:
            return None
        if self.active >= self.max_queue:
            return (f"the server has {self.active} generation requests waiting or running, its serve.max_queue; "
                    f"retry after {RETRY_AFTER_S} s, or start it with a larger serve.max_queue.")
        self.active += 1
        return None

    def done(self, path: str, status: int, seconds: float, release: bool = True) -> None:
        """A request answered; release=False for a stream, which releases its place when it ends."""
        if path in GENERATION_ROUTES and release:
            self.release()
        if self.registry is not None:
            route = path if path in ROUTE_NAMES else "other"
            self._requests.labels(route, str(status)).inc()
            self._latency.labels(route).observe(seconds)

    def release(self) -> None:
        self.active -= 1

    def exposition(self) -> tuple[bytes, str]:
        if self.registry is None:
            raise BadRequest("/metrics needs the prometheus-client package, which is not installed: pip install "
                             "prometheus-client.", status=501)
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


ROUTE_NAMES: set[str] = set()  # filled by the app with its routes, so a label never holds an arbitrary path


async def read_body(request: Any, limit: int, timeout_s: float, too_large: str) -> bytes:
    """The request's body, refused with 413 as soon as more than ``limit`` bytes have arrived and with 408 when the
    client sends nothing for ``timeout_s`` (a chunked body has no Content-Length to refuse it by)."""
    parts, size = [], 0
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout_s)
        except StopAsyncIteration:
            break
        except TimeoutError as err:
            raise BadRequest(f"the request body did not arrive: nothing for {timeout_s:g} s (serve.body_timeout_s); "
                             "send it whole.", status=408) from err
        size += len(chunk)
        if size > limit:
            raise BadRequest(too_large, status=413)
        parts.append(chunk)
    return b"".join(parts)
