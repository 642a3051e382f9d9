"""The daemon's HTTP/1.1 connections: a deadline for each request's head, a cap on how many are open.

uvicorn's h11 protocol waits for a request's head as long as a client cares to take: a
connection that sends half a request line and stops holds its descriptor forever, and a few
thousand of them leave no descriptor for a session's pipes. So each connection gets
``header_timeout`` seconds to finish every request head (the first, and each one after a
response), and past ``max_connections`` open at once a new connection is answered 503 and closed
before anything is read. Bodies are not timed here: only an authenticated agent gets to send
one, and its calls are bounded by ``requests_per_agent``.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from procpilot.errors import TooManyConnections

__all__ = ["guarded_h11"]


def _refusal(max_connections: int) -> bytes:
    error = TooManyConnections(
        f"the daemon holds {max_connections} connections, its limit ([server] max_connections)",
        hints={"retry": "Try again in a moment, and reuse one connection for many requests (keep-alive)."},
    )
    body = json.dumps(error.to_dict()).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"retry-after: 1\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def guarded_h11(header_timeout: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the deadline and the cap (pass as ``uvicorn.Config(http=...)``)."""
    refusal = _refusal(max_connections)

    class GuardedH11(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.write(refusal)
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # a whole head arrived (or an upgrade)
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()  # the next request's head gets the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11
