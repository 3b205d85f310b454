"""The HTTP server under `rlgen serve`: uvicorn, with a limit uvicorn lacks, the time a client may take to send a
request's headers (serve.header_timeout_s). A connection that is still sending them when the limit passes gets
408 and is closed, so clients that trickle headers a byte at a time cannot hold connections open for ever; an idle
kept-alive connection that sent nothing is closed without an answer. The body's own limits are the app's
(rlgen.serve.load.read_body)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from rlgen.wire.protocol import error_body


def _timeout_answer(seconds: float) -> bytes:
    body = json.dumps(error_body(f"the request's headers did not arrive within {seconds:g} s "
                                 "(serve.header_timeout_s); send them whole.", 408)).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, with a timer running while the connection waits for a request's headers: armed
    when the connection opens and after each answer, disarmed once a request's headers have arrived whole."""

    header_timeout_s = 30.0  # set per server by server_config

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._waiting_after: Any = None
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._check()

    def on_response_complete(self) -> None:
        self._arm()  # before a pipelined request (handled inside) can start its cycle
        super().on_response_complete()
        self._check()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self._waiting_after = self.cycle  # headers are whole once a new request cycle starts
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._timed_out)

    def _check(self) -> None:
        if self._header_timer is not None and self.cycle is not self._waiting_after:
            self._disarm()

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        started, _ = self.conn.trailing_data  # bytes of a request whose headers are not whole yet
        if started:
            self.transport.write(_timeout_answer(self.header_timeout_s))
        self.transport.close()


def server_config(app: Any, host: str, port: int, header_timeout_s: float, **kwargs: Any) -> Any:
    """A uvicorn Config serving app on host:port with the header timeout (and the quiet log and no lifespan every
    caller wants)."""
    import uvicorn

    protocol = type("ServeProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": float(header_timeout_s)})
    return uvicorn.Config(app, host=host, port=port, http=protocol, log_level="warning", lifespan="off", **kwargs)


__all__ = ["HeaderTimeoutProtocol", "server_config"]
