"""What every route shares: the calling agent, JSON responses, request bodies, the limits on them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from procpilot import wire
from procpilot.errors import (
    InvalidArgument,
    UnsupportedMediaType,
    error_class,
)

#: The agent (scope) of the request being served; set by the auth middleware, read by every route
#: and, through the MCP SDK's per-message context propagation, by every MCP handler.
current_agent: ContextVar[str | None] = ContextVar("procpilot_agent", default=None)

PROGRESS_EVERY = 1.0  # seconds between MCP progress notifications of a long call
HEARTBEAT_EVERY = 15.0  # seconds between SSE keep-alive comments
EVENT_QUEUE = 1000  # events one SSE client may lag behind before the oldest are dropped
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
# A request body (REST arguments, an MCP message) at most this big: parsing JSON holds the event
# loop (and the GIL) for about 10 ms a MiB, and no call needs more (a command is 120 KiB at most).
MAX_BODY = 1024 * 1024
WS_MAX_MESSAGE = MAX_BODY  # one proc/* frame: a proc/write carries as much as a REST write


# -- errors ------------------------------------------------------------------------------------


#: Every status a tool endpoint can answer (the OpenAPI document lists exactly these).
ERROR_STATUSES = (401, 403, 404, 408, 409, 413, 415, 422, 429, 500, 501, 503)


def status_for_error(code: str) -> int:
    """The HTTP status of the error ``code`` names (its class says; an unknown name is a 500)."""
    cls = error_class(code)
    return 500 if cls is None else cls.http_status


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    body = wire.dumps_bytes(data)  # an agent's text echoed back (an env name) must not make it a 500
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def error_response(code: str, message: str, status: int | None = None, **extra: Any) -> Response:
    return json_response({"error": code, "message": message, "hints": {}, **extra}, status or status_for_error(code))


async def json_body(request: Request, what: str = "a JSON object") -> dict[str, Any]:
    """The request's body as a JSON object (empty: ``{}``); see ``json_object``."""
    return json_object(await request.body(), request.headers.get("content-type", ""), what)


def json_object(body: bytes, content_type: str, what: str = "a JSON object") -> dict[str, Any]:
    """A request body as a JSON object (empty: ``{}``); bad JSON, a body nested too deeply to
    parse, or anything but an object is an InvalidArgument; another content type a 415."""
    if not body.strip():
        return {}
    if not content_type.lower().startswith("application/json"):
        raise UnsupportedMediaType(f"send {what} with Content-Type: application/json")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise InvalidArgument(f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # the parser's own bound, hit in microseconds: no request needs it
        raise InvalidArgument("the body is nested too deeply to parse") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"the body must be {what}")
    return data


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def header_values(scope: Scope, name: bytes) -> list[str]:
    """Every value of the header ``name``, where :func:`header` gives the first: a header that
    may be sent only once is seen repeated."""
    return [bytes(value).decode("latin-1") for key, value in scope.get("headers", ()) if key == name]


def request_agent() -> str:
    """The agent of the request being served (set by the auth middleware)."""
    agent = current_agent.get()
    if agent is None:  # only reachable if a route is served without the middleware
        raise RuntimeError("no authenticated agent for this request")
    return agent
