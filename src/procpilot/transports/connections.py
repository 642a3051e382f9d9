"""The daemon's HTTP/1.1 connections: deadlines for what a client sends, a cap on how many are open.

uvicorn's h11 protocol waits for a request's head as long as a client cares to take: a
connection that sends half a request line and stops holds its descriptor forever, and a few
thousand of them leave no descriptor for a session's pipes. So each connection gets
``header_timeout`` seconds to finish every request head (the first, and each one after a
response), and past ``max_connections`` open at once a new connection is answered 503 and closed
before anything is read. A body the app reads is timed by the app (http/bodies.py: 408 and
closed); the rest of one it answered without reading (a 401, a 413) gets ``body_timeout``
seconds here, then the connection is closed.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from procpilot.config import ServerSettings
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


def guarded_h11(limits: ServerSettings) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the deadlines and the cap ``[server]`` sets (pass as
    ``uvicorn.Config(http=...)``)."""
    header_timeout, body_timeout = limits.header_timeout_sec, limits.body_timeout_sec
    max_connections = limits.max_connections
    refusal = _refusal(max_connections)

    class GuardedH11(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        # The client's state the armed deadline waits for it to leave: IDLE (a head is due) or
        # SEND_BODY (the rest of a body the answer did not need); None when nothing is timed.
        _awaiting: type[h11.IDLE] | type[h11.SEND_BODY] | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.write(refusal)
                transport.close()
                return
            self._watch()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._watch()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _watch(self) -> None:
            """Time what the connection waits for from its client while the daemon has nothing
            to do for it: a head (the first, and each one after a response), or, once answered,
            the rest of a body (a 401 or 413 reads none of it; uvicorn discards it as it comes).
            A body the app is reading is timed by the app (bodies.py), which answers 408."""
            theirs = self.conn.their_state
            if theirs is h11.IDLE:
                self._arm(h11.IDLE, header_timeout)
            elif theirs is h11.SEND_BODY and self.conn.our_state in (h11.DONE, h11.MUST_CLOSE):
                self._arm(h11.SEND_BODY, body_timeout)
            else:  # a request being served, an upgrade, or the end
                self._disarm()

        def _arm(self, awaiting: type[h11.IDLE] | type[h11.SEND_BODY], seconds: float) -> None:
            if self._deadline is not None and self._awaiting is awaiting:
                return  # already timed: more bytes of the same head or body do not extend it
            self._disarm()
            self._awaiting = awaiting
            self._deadline = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = None
            self._awaiting = None

        def _expire(self) -> None:
            awaiting, self._deadline, self._awaiting = self._awaiting, None, None
            if self.conn.their_state is awaiting and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11
