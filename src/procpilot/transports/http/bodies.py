"""A request's body, read whole before its route runs: at most a cap, within a deadline.

A client decides how fast it sends a body; without a deadline one that declares 1000 bytes and
sends 500 holds whatever waits on it (a call slot, a task, a descriptor) for as long as it stays
connected. So the body is read here, at most ``max_bytes`` of it (413 before a byte is read when
the declared length is over), within ``timeout`` seconds (408 ``RequestTimeout`` past it, and the
connection closed: what is left of the body would otherwise be the next request's head), and
handed on from memory. A body the route's answer never needed (a 401 before any reading) is
bounded by the connection itself (transports/connections.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from starlette.types import Message, Receive, Scope, Send

from procpilot.errors import ProcpilotError, RequestTimeout, RequestTooLarge
from procpilot.transports.http.common import header

__all__ = ["error_body", "is_mcp", "read_body", "refuse", "refuse_oversized", "rpc_error"]

# JSON-RPC's "Invalid Request": what a refused MCP request is, whatever the reason.
_INVALID_REQUEST = -32600


async def read_body(scope: Scope, receive: Receive, send: Send, *, max_bytes: int, timeout: float) -> Receive | None:
    """``receive`` replaying the request's whole body, or None once the request is answered (413,
    408) or its client has gone. A request that declares no body is handed on as it is."""
    if header(scope, b"content-length") is None and header(scope, b"transfer-encoding") is None:
        return receive  # no body at all: without either header what follows the head is the next request
    if await refuse_oversized(scope, send, max_bytes=max_bytes):
        return None
    chunks: list[bytes] = []
    size = 0
    try:
        # A body already whole needs no deadline (and no timer armed and cancelled per request).
        async with contextlib.nullcontext() if arrived(receive) else asyncio.timeout(timeout):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return None  # the client left: nobody to answer
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > max_bytes:  # chunked: no length declared up front
                    await _answer(scope, send, _too_large(max_bytes))
                    return None
                chunks.append(chunk)
                if not message.get("more_body"):
                    break
    except TimeoutError:
        said = f"the request body did not arrive within {timeout:g} s ({size} bytes did)"
        await _answer(scope, send, RequestTimeout(said, timeout=timeout), close=True)
        return None
    replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

    async def replayed() -> Message:
        return replay.pop() if replay else await receive()

    return replayed


def arrived(receive: Receive) -> bool:
    """Whether the request's whole body is in memory already, so the first ``receive()`` returns
    it at once: uvicorn's request cycle (whose method ``receive`` is) has parsed the body's end
    (it sets ``more_body`` False then, and wakes its receiver). Anything else: False."""
    cycle = getattr(receive, "__self__", None)
    return type(cycle).__module__.startswith(_UVICORN_HTTP) and getattr(cycle, "more_body", True) is False


_UVICORN_HTTP = "uvicorn.protocols.http."


async def refuse_oversized(scope: Scope, send: Send, *, max_bytes: int) -> bool:
    """Answer 413, before a byte of the body is read, when its declared length is over ``max_bytes``."""
    declared = header(scope, b"content-length")
    if declared is None or (declared.isdigit() and int(declared) <= max_bytes):
        return False
    await _answer(scope, send, _too_large(max_bytes))
    return True


def _too_large(max_bytes: int) -> RequestTooLarge:
    return RequestTooLarge(f"the request body is larger than {max_bytes} bytes", limit=max_bytes)


def error_body(scope: Scope, error: ProcpilotError) -> bytes:
    """The body that refuses a request with ``error``: the typed error as JSON, and on ``/mcp`` a
    JSON-RPC error carrying it (``message`` with the hints, ``data`` the typed error), which MCP
    clients show as they are; a bare JSON body they replace with "Server returned an error
    response"."""
    if not is_mcp(scope):
        return json.dumps(error.to_dict()).encode()
    hints = " ".join(f"- {text}" for text in error.hints.values())
    said = f"{error.code}: {error.message}" + (f" What to do next: {hints}" if hints else "")
    return rpc_error(said, error.to_dict())


def is_mcp(scope: Scope) -> bool:
    """Whether the request is for the MCP endpoint (the daemon's, and ``procpilot mcp --http``'s)."""
    return scope["type"] == "http" and str(scope.get("path", "")).rstrip("/") == "/mcp"


def rpc_error(message: str, data: dict[str, object]) -> bytes:
    """A JSON-RPC error answering a request whose id was never read (``id: null``)."""
    error = {"code": _INVALID_REQUEST, "message": message, "data": data}
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


async def refuse(scope: Scope, send: Send, error: ProcpilotError) -> None:
    """Answer with ``error`` before the body is read (a JSON-RPC error on ``/mcp``)."""
    await _answer(scope, send, error)


async def _answer(scope: Scope, send: Send, error: ProcpilotError, *, close: bool = False) -> None:
    body = error_body(scope, error)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))  # uvicorn closes the connection after this answer
    await send({"type": "http.response.start", "status": error.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
