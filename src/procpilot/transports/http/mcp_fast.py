"""``tools/call`` on the daemon's ``/mcp`` answered without the SDK's per-request machinery.

After 100 ms of idle an ``exec true`` over MCP on the daemon cost 4.8x a raw ``sh -c true`` where
REST cost 3.2x: the SDK's path for one POST (a pydantic parse of the message, the session's memory
streams and message router, a task group and an ``EventSourceResponse`` with its own tasks, the
dispatcher, a ``Context``, the result through three pydantic models) is ~3 ms of cold code. A
call the SDK would answer as a plain function call is answered here instead, on the request's own
task, with the JSON the SDK writes for it (transports/mcp_results.py, shared with the SDK's path
and the stdio direct path; tests/transports/http/test_mcp_fast.py compares the two paths' replies
for every protocol version served).

Everything before the route still applies (http/auth.py: the token's agent, loopback Host and
Origin, the body's cap and deadline, the agent's call slot), the tool runs through its
``ToolSpec`` (the gate: tiers, approvals, audit events; the face: arguments validated and
bounded), and only what needs nothing else of the SDK goes this way; everything else reaches the
SDK untouched:

- handshake era (no ``MCP-Protocol-Version`` header, or a handshake version): a POST naming an
  open session of the caller's own (the SDK's owner check) whose connection the SDK has seen
  initialised with a version in ``SHAPED_ALIKE`` (learned from a request it served on that
  session: every client lists the tools first), a ``tools/call`` of a known tool with ``name`` and
  ``arguments`` only (no ``_meta``, so no progress token), an id not already running here. The
  reply is the SSE stream the SDK answers with (written whole with its length when the call ends
  before a keep-alive was due, rather than chunked). ``notifications/cancelled`` for such a call ends
  it, and it is answered as the SDK answers a cancelled request on this era's wire
  (``-32800 Request cancelled``). The session's idle countdown waits while a call runs, as it
  does for the SDK's requests.
- 2026-07-28 (that header): a ``tools/call`` whose ``_meta`` envelope is one the SDK has already
  answered with a result on this daemon (so one it validated), whose routing headers agree with
  the body (the SDK's own ``classify_inbound_request``), and with no ``Mcp-Param-*`` header. The
  reply is JSON, or after ``_PING`` seconds an SSE stream with keep-alive comments, as the SDK
  does; a client that closes the connection cancels the call, and it is never answered.

A request with a header repeated, a body with a lone surrogate escape (the SDK's parser refuses
one), the wrong content type or ``Accept``: all the SDK's. A call cancelled here only stops the
waiting, as on the SDK's path: the session it started runs on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from typing import Any, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from procpilot import chat_context, wire
from procpilot.aio import cancel_and_wait
from procpilot.contract import ToolResult, ToolSpec
from procpilot.transports import mcp_sdk
from procpilot.transports.http.common import request_agent
from procpilot.transports.mcp_results import MODERN, SHAPED_ALIKE, STAMP_KEY, call_result, failed_call_result

__all__ = ["FastCalls", "FastHost"]

_log = logging.getLogger(__name__)
_QUICK = 0.05  # seconds a call may take before its client's disconnecting is watched
_PING = 15.0  # seconds of silence before a keep-alive comment (the SDK's interval, both eras)
_REQUEST_CANCELLED = -32800  # the SDK's answer to a cancelled request on the handshake-era wire
_ENVELOPES = 64  # 2026-07-28 envelopes remembered as accepted (one per client kind, in practice)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SSE = b"text/event-stream"
_JSON = b"application/json"
_PING_LINE = b": ping\r\n\r\n"


class FastHost(Protocol):
    """What the MCP face gives this path: its tools (as the SDK's path calls them), the scope a
    request acts in, the connections the SDK has served, and the legacy exit listeners."""

    @property
    def fast_tools(self) -> Mapping[str, ToolSpec]: ...

    def scope_for(self, agent: str, conversation: str | None) -> str: ...

    def connection_of(self, session_id: str) -> Any: ...

    def follow(self, version: str | None, connection: Any, scope: str, tool: str, result: ToolResult) -> None: ...


class FastCalls:
    """The ASGI app in front of the SDK's ``/mcp`` app: takes the calls it can answer, hands it
    the rest. ``answered`` counts the calls answered here."""

    def __init__(self, app: ASGIApp, host: FastHost, manager: Any, *, limit: int = 256) -> None:
        self.app = app
        self.host = host
        self.manager = manager
        self.limit = limit  # calls running here per MCP session
        self.answered = 0
        self._running: dict[str, dict[tuple[bool, object], asyncio.Future[ToolResult]]] = {}
        self._envelopes: dict[str, None] = {}  # canonical JSON of accepted envelopes, oldest first
        self._stamp: Any = None  # the server's info, as the SDK stamps a 2026-07-28 result
        self._owners: dict[str, str] = {}  # MCP session id -> the agent the SDK's owner check passed
        self._owners_prune_at = 256

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        raw = scope["headers"]
        headers = {bytes(k): bytes(v) for k, v in raw}
        version = headers.get(b"mcp-protocol-version")
        modern = version == MODERN.encode()
        plain = len(headers) == len(raw) and _json_body(headers) and _accepts_both(headers)
        if not plain or not (modern or version is None or version.decode("latin-1") in SHAPED_ALIKE):
            await self.app(scope, receive, send)
            return
        first = await receive()
        replay = _Replay(first, receive)
        body = first.get("body", b"") if first["type"] == "http.request" and not first.get("more_body") else None
        if body is None:
            await self.app(scope, replay, send)
            return
        if modern:
            learn = await self._modern(scope, headers, body, receive, send)
            if learn is not None:
                await self.app(scope, replay, self._learning(learn, send))
        elif not await self._legacy(scope, headers, body, receive, send):
            await self.app(scope, replay, send)

    # -- the handshake era --

    async def _legacy(
        self, scope: Scope, headers: dict[bytes, bytes], body: bytes, receive: Receive, send: Send
    ) -> bool:
        session_id = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if not session_id or not (b'"tools/call"' in body or b'"notifications/cancelled"' in body):
            return False
        transport = mcp_sdk.open_sessions(self.manager).get(session_id)
        if transport is None or not self._owned(session_id, scope):
            return False
        connection = self.host.connection_of(session_id)
        version = getattr(connection, "protocol_version", None)
        if version not in SHAPED_ALIKE or not connection.initialized.is_set():
            return False
        message = _message(body)
        if message is None or ("id" in message and message.get("method") == "notifications/cancelled"):
            return False
        running = self._running.get(session_id, {})
        if message.get("method") == "notifications/cancelled":
            params = message.get("params")
            key = _key(params.get("requestId")) if isinstance(params, dict) else None
            call = running.get(key) if key is not None else None
            if call is None:
                return False  # not one of ours: the SDK's to apply (or to ignore)
            call.cancel()  # its own request answers it, as cancelled
            await _respond(send, 202, [(b"content-type", _JSON), (b"mcp-session-id", session_id.encode())], b"")
            return True
        found = self._call_of(message, modern=False)
        if found is None or len(running) >= self.limit or found[2] in running:
            return False
        spec, arguments, key = found
        with mcp_sdk.session_busy(transport) as open_:
            if not open_:
                return False  # the session is ending: the SDK answers that
            running = self._running.setdefault(session_id, running)
            scope_id = self.host.scope_for(request_agent(), session_id)
            call = running[key] = asyncio.ensure_future(spec.call(arguments, scope_id))
            try:
                stream = _sse_headers(session_id)
                outcome = await _outcome(call, receive, send, stream)
            finally:
                del running[key]
                if not running:
                    self._running.pop(session_id, None)
            if outcome.gone:
                return True
            request_id = message["id"]
            if outcome.cancelled:
                error = {"code": _REQUEST_CANCELLED, "message": "Request cancelled"}
                reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "error": error}
            else:
                if isinstance(outcome.result, ToolResult):
                    self.host.follow(version, connection, scope_id, spec.name, outcome.result)
                reply = {"jsonrpc": "2.0", "id": request_id, "result": outcome.shaped(version, None)}
            frame = b"event: message\r\ndata: " + wire.dumps_bytes(reply) + b"\r\n\r\n"
            if outcome.opened:
                await send({"type": "http.response.body", "body": frame})
            else:  # the whole stream at once: its length said, so no chunk framing to write and read
                await _respond(send, 200, stream, frame)
        self.answered += 1
        return True

    def _owned(self, session_id: str, scope: Scope) -> bool:
        """Whether the request's principal opened the session (the SDK's owner check), remembered
        per session and agent once it passed: who opened a session never changes."""
        agent = request_agent()
        if self._owners.get(session_id) == agent:
            return True
        if mcp_sdk.session_owner(self.manager, session_id) != mcp_sdk.requestor(scope):
            return False
        if len(self._owners) >= self._owners_prune_at:  # pruned when doubled: no walk per call
            live = mcp_sdk.open_sessions(self.manager)
            for gone in [k for k in self._owners if k not in live]:
                del self._owners[gone]
            self._owners_prune_at = max(256, 2 * len(self._owners))
        self._owners[session_id] = agent
        return True

    # -- 2026-07-28 --

    async def _modern(
        self, scope: Scope, headers: dict[bytes, bytes], body: bytes, receive: Receive, send: Send
    ) -> str | None:
        """None once answered here; else the SDK's, with the envelope to learn from its answer
        (the empty string: nothing to learn)."""
        message = _message(body)
        params = message.get("params") if message is not None else None
        meta = params.get("_meta") if isinstance(params, dict) else None
        if message is None or not isinstance(meta, dict) or "id" not in message:
            return ""
        if chat_context.META_KEY in meta:
            return ""  # the SDK's path serves the call as coming from that chat (transports/mcp.py)
        envelope = json.dumps(meta, sort_keys=True, default=str)
        if envelope not in self._envelopes:
            return envelope
        found = self._call_of(message, modern=True) if message.get("method") == "tools/call" else None
        if found is None or any(name.startswith(b"mcp-param-") for name in headers):
            return ""
        from mcp.shared.inbound import InboundModernRoute, classify_inbound_request

        text_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers.items()}
        if not isinstance(classify_inbound_request(message, headers=text_headers), InboundModernRoute):
            return ""  # the SDK answers the mismatch
        spec, arguments, _ = found
        conversation = headers.get(b"mcp-session-id", b"").decode("latin-1") or None
        call = asyncio.ensure_future(spec.call(arguments, self.host.scope_for(request_agent(), conversation)))
        stream = [(b"content-type", _SSE), (b"cache-control", b"no-cache, no-transform"), (b"x-accel-buffering", b"no")]
        outcome = await _outcome(call, receive, send, stream)
        if outcome.gone or outcome.cancelled:
            return None  # the client closed the stream: a cancelled request is never answered
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": outcome.shaped(MODERN, self._stamp)}
        data = wire.dumps_bytes(reply)
        if outcome.opened:
            await send({"type": "http.response.body", "body": b"event: message\r\ndata: " + data + b"\r\n\r\n"})
        else:
            await _respond(send, 200, [(b"content-type", _JSON)], data)
        self.answered += 1
        return None

    def _learning(self, envelope: str, send: Send) -> Send:
        """``send`` that watches the SDK's answer: a result stamped with the server's info
        means it accepted ``envelope``."""
        if not envelope:
            return send
        chunks: list[bytes] = []
        status = 0

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if (dict(message.get("headers", [])).get(b"content-type") or b"").startswith(_JSON):
                    chunks.append(b"")
            elif message["type"] == "http.response.body" and status == 200 and chunks:
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self._learn(envelope, b"".join(chunks))
            await send(message)

        return watched

    def _learn(self, envelope: str, body: bytes) -> None:
        try:
            result = json.loads(body).get("result")
        except (ValueError, AttributeError, RecursionError):
            return
        meta = result.get("_meta") if isinstance(result, dict) else None
        if not isinstance(meta, dict) or not meta.get(STAMP_KEY):
            return
        self._stamp = meta[STAMP_KEY]
        if len(self._envelopes) >= _ENVELOPES:
            del self._envelopes[next(iter(self._envelopes))]
        self._envelopes[envelope] = None

    # -- both --

    def _call_of(
        self, message: dict[str, Any], *, modern: bool
    ) -> tuple[ToolSpec, dict[str, Any], tuple[bool, object]] | None:
        """The tool, its arguments and the id's key of a plain call, or None."""
        params, key = message.get("params"), _key(message.get("id"))
        allowed = {"name", "arguments", "_meta"} if modern else {"name", "arguments"}
        if key is None or message.get("method") != "tools/call" or not isinstance(params, dict):
            return None
        if not params.keys() <= allowed:
            return None
        name = params.get("name")
        # A list or an object as the name is unhashable: the SDK answers it (-32602), not a 500.
        spec = self.host.fast_tools.get(name) if isinstance(name, str) else None
        arguments = params.get("arguments", {})
        if spec is None or not isinstance(arguments, dict):
            return None
        return spec, arguments, key


class _Outcome:
    """How a call ended: with its result (or the exception it raised), ``cancelled`` by
    notifications/cancelled, or ``gone`` with its client; and whether the response's stream was
    opened meanwhile (a keep-alive written)."""

    def __init__(self, call: asyncio.Future[ToolResult], opened: bool, *, gone: bool = False) -> None:
        self.opened = opened
        self.gone = gone
        self.cancelled = not gone and call.cancelled()
        self.result: ToolResult | BaseException | None = None
        if not gone and not self.cancelled:
            self.result = call.exception() or call.result()

    def shaped(self, version: str, stamp: Any) -> dict[str, Any]:
        if isinstance(self.result, ToolResult):
            return call_result(self.result, version, stamp)
        # ToolSpec.call makes errors results: this is a bug, answered as the SDK would
        _log.error("Tool raised an unexpected exception", exc_info=self.result)
        return failed_call_result(self.result or RuntimeError("no result"), version, stamp)


async def _outcome(
    call: asyncio.Future[ToolResult], receive: Receive, send: Send, stream: list[tuple[bytes, bytes]]
) -> _Outcome:
    """Wait for ``call``; every ``_PING`` seconds of it, open the response as the SSE stream of
    ``stream``'s headers (once) and write a keep-alive. A client that disconnects cancels it
    (watched only once the call has taken ``_QUICK``: most end sooner, and a watcher is a task)."""
    gone: asyncio.Future[None] | None = None
    opened = False
    try:
        await asyncio.wait((call,), timeout=_QUICK)
        if call.done():
            return _Outcome(call, False)
        gone = asyncio.ensure_future(_disconnected(receive))
        while True:
            done, _ = await asyncio.wait((call, gone), timeout=_PING, return_when=asyncio.FIRST_COMPLETED)
            if call in done:
                return _Outcome(call, opened)
            if gone in done:
                await cancel_and_wait(call)
                return _Outcome(call, opened, gone=True)
            if not opened:
                await send({"type": "http.response.start", "status": 200, "headers": stream})
                opened = True
            await send({"type": "http.response.body", "body": _PING_LINE, "more_body": True})
    finally:
        if not call.done():  # this request itself was cancelled (the server stopping)
            await cancel_and_wait(call)
        if gone is not None:
            await cancel_and_wait(gone)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _respond(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [*headers, _length(body)]})
    await send({"type": "http.response.body", "body": body})


def _length(body: bytes) -> tuple[bytes, bytes]:
    return (b"content-length", str(len(body)).encode())


def _sse_headers(session_id: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", _SSE),
        (b"cache-control", b"no-cache, no-transform"),
        (b"connection", b"keep-alive"),
        (b"x-accel-buffering", b"no"),
        (b"mcp-session-id", session_id.encode()),
    ]


def _json_body(headers: Mapping[bytes, bytes]) -> bool:
    """``Content-Type: application/json``, read as the SDK reads it."""
    value = headers.get(b"content-type", b"").split(b";")[0]
    return any(part.strip() == _JSON for part in value.split(b","))


def _accepts_both(headers: Mapping[bytes, bytes]) -> bool:
    """``Accept`` names JSON and SSE, as the SDK's check_accept_headers reads it (wildcards too)."""
    kinds = {part.split(b";")[0].strip().lower() for part in headers.get(b"accept", b"").split(b",")}
    return b"*/*" in kinds or (bool(kinds & {_JSON, b"application/*"}) and bool(kinds & {_SSE, b"text/*"}))


def _message(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON-RPC 2.0 object, or None for what only the SDK answers right."""
    if _SURROGATE_ESCAPE.search(body):
        return None  # json.loads reads a lone surrogate, the SDK's parser refuses it: as it does
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return None
    return message


def _key(request_id: object) -> tuple[bool, object] | None:
    """A JSON-RPC id as a dict key: 1 and "1" are different ids (and true is none at all)."""
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    return (isinstance(request_id, str), request_id)


class _Replay:
    """``receive`` that gives the message already read first, then the client's own."""

    def __init__(self, first: Message, receive: Receive) -> None:
        self._first: Message | None = first
        self._receive = receive

    async def __call__(self) -> Message:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._receive()
