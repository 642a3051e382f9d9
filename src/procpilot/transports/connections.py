"""The daemon's HTTP/1.1 connections: deadlines for what a client sends, a cap on how many are open,
a bound on a request's head.

The protocol is uvicorn's ``httptools`` one (llhttp, in C: 0.2-0.5 ms less a request after
idle than its pure-Python h11 one, docs/performance.md), with what uvicorn leaves out:

- uvicorn waits for a request's head as long as a client cares to take: a connection that sends
  half a request line and stops holds its descriptor forever, and a few thousand of them leave no
  descriptor for a session's pipes. So each connection gets ``header_timeout`` seconds to finish
  every request head (the first, and each one after a response). One timer per connection
  times this and uvicorn's keep-alive timeout (an idle connection closed ``timeout_keep_alive``
  seconds after its last response), kept across requests: a request only moves its deadlines.
- past ``max_connections`` open at once a new connection is answered 503 and closed before
  anything is read.
- a body the app reads is timed by the app (http/bodies.py: 408 and closed); the rest of one it
  answered without reading (a 401, a 413) gets ``body_timeout`` seconds here, then the connection
  is closed.
- uvicorn writes a response's head and its body in two writes: two segments on the wire, and a
  client that reads the head wakes up twice. What a request writes is joined instead: a write is
  held until the next one or the end of the event loop's pass, whichever comes first
  (``_Joining``), so a head and a body sent together leave in one write, and a stream's head
  or chunk is not held back.
- llhttp keeps no limit on a head: httptools gathers a header's pieces, uvicorn the URL's, for as
  long as they come. A head (or a chunked body's trailer) is held to ``MAX_HEAD`` bytes, h11's
  limit: past it the request is answered 431 with a typed error and the connection closed. A
  head that arrives in one read is measured exactly; one that spans reads is counted read by read,
  so at most ``MAX_HEAD`` and one read (256 KiB) are ever held for it.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Literal

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from procpilot.config import ServerSettings
from procpilot.errors import ProcpilotError, RequestTooLarge, TooManyConnections

__all__ = ["MAX_HEAD", "guarded_http"]

# A request head's bytes (its URL and header lines; a chunked body's trailer), as h11 allows.
MAX_HEAD = 16 * 1024


def _answer(status: str, error: ProcpilotError, retry_after: bool = False) -> bytes:
    body = json.dumps(error.to_dict()).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        + ("retry-after: 1\r\n" if retry_after else "")
        + f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _refusal(max_connections: int) -> bytes:
    error = TooManyConnections(
        f"the daemon holds {max_connections} connections, its limit ([server] max_connections)",
        hints={"retry": "Try again in a moment, and reuse one connection for many requests (keep-alive)."},
    )
    return _answer("503 Service Unavailable", error, retry_after=True)


_HEAD_TOO_LARGE = _answer(
    "431 Request Header Fields Too Large",
    RequestTooLarge(
        f"the request head is larger than {MAX_HEAD} bytes",
        limit=MAX_HEAD,
        hints={"smaller": "Send shorter headers and URL: put what is big in the request body."},
    ),
)


class _Joining:
    """The transport as uvicorn's response cycle sees it: a write is held until the next write,
    which goes out joined with it, or until the loop's next pass, whichever comes first."""

    __slots__ = ("_held", "_loop", "_release", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._release: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._held = bytes(data)
            self._release = self._loop.call_soon(self.flush)
            return
        joined, self._held = self._held + data, None
        if self._release is not None:
            self._release.cancel()
            self._release = None
        self._transport.write(joined)

    def flush(self) -> None:
        held, self._held, self._release = self._held, None, None
        if held is not None:
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


# Seconds a deadline's timer may fire before it (the loop runs a timer up to its clock's
# resolution early): within them it is due.
_EARLY = 0.001


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop the parse of a head past ``MAX_HEAD``."""


def guarded_http(limits: ServerSettings) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with the deadlines, the cap ``[server]`` sets and the head's
    bound (pass as ``uvicorn.Config(http=...)``)."""
    header_timeout, body_timeout = limits.header_timeout_sec, limits.body_timeout_sec
    max_connections = limits.max_connections
    refusal = _refusal(max_connections)

    class GuardedHttpTools(HttpToolsProtocol):
        # The deadline: what the client must finish by ``_due`` (the loop's clock), a head or
        # the rest of a body the answer did not need (None: nothing is timed), and the timer,
        # due at or before ``_due``, that checks it. The timer outlives what it timed: a request
        # only sets ``_awaiting`` and ``_due``, and a timer due too early arms itself again for
        # the rest when it fires (one timer per connection and deadline period, not one armed
        # and cancelled per keep-alive request).
        _awaiting: Literal["head", "body"] | None = None
        _due = 0.0
        _timer: asyncio.TimerHandle | None = None
        # uvicorn's keep-alive timeout, on the same timer: once a response is complete, the
        # connection is closed at ``_idle_due`` unless a byte arrives first (None: not idle).
        # uvicorn arms and cancels a timer of its own for it on every request.
        _idle_due: float | None = None
        # True iff the parser is between a head's end and its message's end (in a body).
        _in_body = False
        # Bytes the parser may hold of the head (or trailer) being read, counted over reads that
        # finish nothing; a read that ends a head, a chunk or a message starts it again at 0.
        _held = 0
        _body_fed = 0  # body bytes handed on during the current read
        _restarted = False  # True iff the current read ended a head, a chunk or a message

        _joining: _Joining | None = None  # the connection's responses' writes (one per connection)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._joining = _Joining(transport, self.loop)
            if len(self.connections) > max_connections:
                transport.write(refusal)
                transport.close()
                return
            self._watch()

        def data_received(self, data: bytes) -> None:
            # uvicorn's own, with the head's bound: the 431 is the only answer a refused head gets.
            self._unset_keepalive_if_required()
            self._body_fed, self._restarted = 0, False
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
            except httptools.HttpParserError as exc:
                if isinstance(exc.__context__, _HeadTooLarge):
                    self._refuse_head()
                else:
                    if self._joining is not None:
                        self._joining.flush()
                    self.logger.warning("Invalid HTTP request received.")
                    self.send_400_response("Invalid HTTP request received.")
                self._disarm()
                return
            held = len(data) - self._body_fed
            self._held = 0 if self._restarted else self._held + held
            if self._held > MAX_HEAD:
                self._refuse_head()
            self._watch()

        # The parser's callbacks: the state the deadlines and the head's bound follow.
        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            if len(self.url) > MAX_HEAD:
                raise _HeadTooLarge

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            if self._in_body:  # a trailer's field: counted as a head's (uvicorn adds them to the headers)
                self._held += len(name) + len(value)
                if self._held > MAX_HEAD:
                    raise _HeadTooLarge

        def on_headers_complete(self) -> None:
            if len(self.url) + sum(len(name) + len(value) for name, value in self.headers) > MAX_HEAD:
                raise _HeadTooLarge
            self._in_body, self._restarted, self._held = True, True, 0
            previous = self.cycle
            super().on_headers_complete()
            if self.cycle is not previous:  # a request to serve (not an upgrade): its task has not run yet
                self.cycle.transport = self._joining  # type: ignore[assignment]

        def on_body(self, body: bytes) -> None:
            self._body_fed += len(body)
            super().on_body(body)

        def on_chunk_header(self) -> None:
            self._restarted, self._held = True, 0

        def on_chunk_complete(self) -> None:
            self._restarted, self._held = True, 0

        def on_message_complete(self) -> None:
            self._in_body, self._restarted, self._held = False, True, 0
            super().on_message_complete()

        def _unset_keepalive_if_required(self) -> None:
            # uvicorn's, called as a byte arrives, a response completes and the connection ends.
            super()._unset_keepalive_if_required()  # its timer is never armed here: nothing to cancel
            self._idle_due = None

        def on_response_complete(self) -> None:
            # uvicorn's (0.54), with its keep-alive timer left to the connection's deadline timer.
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            else:
                self._idle_due = self.loop.time() + self.timeout_keep_alive
            if not self.transport.is_closing():
                self._watch()
                self._schedule()

        def shutdown(self) -> None:
            # uvicorn closes an idle connection at once: a write still held would be dropped.
            if self._joining is not None:
                self._joining.flush()
            super().shutdown()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm(cancel=True)
            super().connection_lost(exc)

        def _refuse_head(self) -> None:
            if self._joining is not None:
                self._joining.flush()  # what a response before it wrote goes first
            if not self.transport.is_closing():
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

        def _serving(self) -> bool:
            return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

        def _watch(self) -> None:
            """Time what the connection waits for from its client while the daemon has nothing
            to do for it: a head (the first, and each one after a response), or, once answered,
            the rest of a body (a 401 or 413 reads none of it; uvicorn discards it as it comes).
            A body the app is reading is timed by the app (bodies.py), which answers 408."""
            closed_or_upgraded = self.transport.is_closing() or self.transport.get_protocol() is not self
            if closed_or_upgraded:
                self._disarm(cancel=True)
            elif self._serving():
                self._disarm()
            elif self._in_body:
                self._arm("body", body_timeout)
            else:
                self._arm("head", header_timeout)

        def _arm(self, awaiting: Literal["head", "body"], seconds: float) -> None:
            if self._awaiting == awaiting:
                return  # already timed: more bytes of the same head or body do not extend it
            self._awaiting = awaiting
            self._due = self.loop.time() + seconds
            self._schedule()

        def _schedule(self) -> None:
            """The timer due at or before the nearest deadline: it fires first, and arms itself
            again for the rest."""
            due = self._due if self._awaiting is not None else math.inf
            if self._idle_due is not None and self._idle_due < due:
                due = self._idle_due
            timer = self._timer
            if due == math.inf or (timer is not None and timer.when() <= due):
                return
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(due, self._expire)

        def _disarm(self, *, cancel: bool = False) -> None:
            """Time nothing; ``cancel``: and end the timer (the connection is closed or is no
            longer HTTP's), else it stays for the next deadline."""
            self._awaiting = None
            if cancel and self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self) -> None:
            self._timer = None
            now = self.loop.time() + _EARLY
            if self._idle_due is not None and now >= self._idle_due:
                self._idle_due = None
                self.timeout_keep_alive_handler()  # uvicorn's: an idle keep-alive connection is closed
                return
            awaiting = self._awaiting
            if awaiting is None or now < self._due:
                self._schedule()  # what it timed ended in time, or is due later
                return
            self._awaiting = None
            waiting_still = not self._serving() and self._in_body == (awaiting == "body")
            if waiting_still and not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpTools
