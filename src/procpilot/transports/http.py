"""The daemon's HTTP face: REST, server-sent events, WebSocket and MCP on one Starlette app.

    POST /v1/tools/{name}   every tool of every face; same inputs, results and typed errors as MCP
    GET  /v1/tools          the tools with their input schemas
    GET  /openapi.json      an OpenAPI 3.1 document built from the tools' input models
    GET  /v1/capabilities   which mechanisms this host gives the supervisor (limits, tree kill, isolation)
    GET  /v1/approvals      calls held for approval (approvers only: [server] approvers)
    POST /v1/approvals/{id} {"decision": "approve"|"deny", "reason"?}: decide one (never your own)
    GET  /v1/events         server-sent events: exits and audit events of the caller's scope
    WS   /v1/proc           the proc/* protocol (spec 003), output pushed live
    /mcp                    MCP over streamable HTTP (both protocol eras)

Every request carries ``Authorization: Bearer <token>``; the token alone decides the caller's
agent (its scope), never a request field. A missing or wrong token is a bare 401. With no tokens
configured (loopback only) every caller is the one ``open_agent``. On a loopback binding the
``Host`` and ``Origin`` headers must name the loopback too, so a web page cannot reach the
daemon through DNS rebinding or a cross-site form post.

REST error statuses (the JSON body is the error's ``{"error", "message", "hints", ...}``), each
the ``http_status`` of its class in ``procpilot.errors``:

    401 Unauthorized          no token, or a wrong one (a fixed body that reveals nothing more)
    403 policy refusals       CommandDenied, UnanalyzableCommand, PermissionDenied, ApprovalDenied,
                              ElevationDenied, ApprovalForbidden, SelfApprovalDenied
    404 SessionNotFound       (also another agent's session), UnknownTool, ApprovalNotFound
    409 SessionStateError     ProcessAlreadyExited, SessionStillRunning, StdinClosed
    415 UnsupportedMediaType  a body that is not application/json
    422 InvalidArgument       and its family; CommandNotFound, PathOutOfScope, ProtectedVariable,
                              LimitAboveAllocation: the request names something unusable;
                              ResourceLimitExceeded: the process outgrew the limits it ran under
    429 ProcLimit             the agent already runs as many sessions as it may
    500                       SpawnFailed, KillFailed and anything else unexpected
    501 NotSupported          IsolationUnavailable
    503 ProcpilotError        the daemon is shutting down

A command that runs and fails is a normal 200 result (``status: "error"``), never an HTTP error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from procpilot.config import Settings
from procpilot.contract import ToolSpec
from procpilot.engine.events import EventBus
from procpilot.engine.session import ExitInfo
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import (
    ApprovalForbidden,
    InvalidArgument,
    NotSupported,
    ProcpilotError,
    RequestTooLarge,
    SelfApprovalDenied,
    SessionNotFound,
    TooManyConnections,
    UnsupportedMediaType,
    error_class,
)

__all__ = [
    "WS_MAX_MESSAGE",
    "Daemon",
    "TokenAuth",
    "build_openapi",
    "create_app",
    "current_agent",
    "daemon_of",
    "guarded_mcp_app",
    "request_agent",
    "status_for_error",
]

_log = logging.getLogger(__name__)

#: The agent (scope) of the request being served; set by the auth middleware, read by every route
#: and, through the MCP SDK's per-message context propagation, by every MCP handler.
current_agent: ContextVar[str | None] = ContextVar("procpilot_agent", default=None)

_PROGRESS_EVERY = 1.0  # seconds between MCP progress notifications of a long call
_HEARTBEAT_EVERY = 15.0  # seconds between SSE keep-alive comments
_EVENT_QUEUE = 1000  # events one SSE client may lag behind before the oldest are dropped
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
# A request body (REST arguments, an MCP message) at most this big: parsing JSON holds the event
# loop (and the GIL) for about 10 ms a MiB, and no call needs more (a command is 120 KiB at most).
_MAX_BODY = 1024 * 1024
WS_MAX_MESSAGE = _MAX_BODY  # one proc/* frame: a proc/write carries as much as a REST write


# -- errors ------------------------------------------------------------------------------------


#: Every status a tool endpoint can answer (the OpenAPI document lists exactly these).
ERROR_STATUSES = (401, 403, 404, 409, 413, 415, 422, 429, 500, 501, 503)


def status_for_error(code: str) -> int:
    """The HTTP status of the error ``code`` names (its class says; an unknown name is a 500)."""
    cls = error_class(code)
    return 500 if cls is None else cls.http_status


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _error(code: str, message: str, status: int | None = None, **extra: Any) -> Response:
    return _json({"error": code, "message": message, "hints": {}, **extra}, status or status_for_error(code))


async def _json_body(request: Request, what: str = "a JSON object") -> dict[str, Any]:
    """The request's body as a JSON object (empty: ``{}``); bad JSON, a body nested too deeply
    to parse, or anything but an object is an InvalidArgument; another content type a 415."""
    body = await request.body()
    if not body.strip():
        return {}
    if not request.headers.get("content-type", "").lower().startswith("application/json"):
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


# -- auth --------------------------------------------------------------------------------------


class TokenAuth:
    """Bearer tokens -> agent ids, compared in constant time; the tokens themselves are not kept.

    Each presented token is hashed and compared with every configured token's hash with
    ``hmac.compare_digest`` (no early exit), so neither timing nor length tells anything.
    """

    def __init__(self, tokens: Mapping[str, str], open_agent: str | None = None) -> None:
        self._digests = [(hashlib.sha256(t.encode()).digest(), agent) for t, agent in tokens.items()]
        self.open_agent = None if self._digests else open_agent

    @property
    def required(self) -> bool:
        return bool(self._digests)

    def agent_for(self, authorization: str | None) -> str | None:
        if not self._digests:
            return self.open_agent
        if not authorization:
            return None
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        digest = hashlib.sha256(presented.strip().encode()).digest()
        found = None
        for known, agent in self._digests:
            if hmac.compare_digest(digest, known):
                found = agent
        return found


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _loopback_host(host: str | None) -> bool:
    """``host`` is a loopback name, with or without a port: ``localhost:8765`` is,
    ``localhost:evil.example`` and ``localhost.evil.example`` are not."""
    if not host:
        return False
    name, colon, port = host.rpartition(":") if not host.endswith("]") else ("", "", "")
    if not colon or not port.isdigit():
        name = host
    return name in _LOOPBACK_HOSTS


def _loopback_origin(origin: str | None) -> bool:
    if origin is None:
        return True  # not a browser, or same origin
    for scheme in ("http://", "https://"):
        if origin.startswith(scheme):
            return _loopback_host(origin[len(scheme) :])
    return False


# Fixed texts: they satisfy the Error schema (which requires a message) and say nothing about why
# (no "token expired", "unknown agent", "bad host"), so a prober learns nothing from them.
_UNAUTHORIZED = b'{"error":"Unauthorized","message":"Unauthorized."}'
_FORBIDDEN = b'{"error":"Forbidden","message":"Forbidden."}'


class AuthMiddleware:
    """Pure ASGI: resolves the bearer token to an agent, refuses everything else with a bare 401,
    and refuses a body over ``max_body`` bytes (413) before anything reads it."""

    def __init__(
        self,
        app: ASGIApp,
        auth: TokenAuth,
        *,
        loopback_only: bool,
        max_body: int = _MAX_BODY,
        requests_per_agent: int = 16,
    ) -> None:
        self.app = app
        self.auth = auth
        self.loopback_only = loopback_only
        self.max_body = max_body
        # Calls one agent may have running at once (REST and MCP POSTs); past it its own calls
        # wait their turn, so a flood from one agent queues behind itself, not before the others.
        self.requests_per_agent = requests_per_agent
        self.in_flight: dict[str, asyncio.Semaphore] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.loopback_only and (
            not _loopback_host(_header(scope, b"host")) or not _loopback_origin(_header(scope, b"origin"))
        ):
            await self._refuse(scope, receive, send, 403, _FORBIDDEN)
            return
        agent = self.auth.agent_for(_header(scope, b"authorization"))
        if agent is None:
            await self._refuse(scope, receive, send, 401, _UNAUTHORIZED)
            return
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from mcp.server.auth.provider import AccessToken

        # The MCP SDK binds each MCP session to the principal that opened it: another agent's
        # token presenting that Mcp-Session-Id is answered as if the session did not exist.
        scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=agent, scopes=[]))
        if scope["type"] == "http":
            bounded = await self._bounded_body(scope, receive, send)
            if bounded is None:
                return
            receive = bounded
        token = current_agent.set(agent)
        try:
            if scope["type"] == "http" and scope["method"] == "POST":
                slots = self.in_flight.setdefault(agent, asyncio.Semaphore(self.requests_per_agent))
                async with slots:
                    await self.app(scope, receive, send)
            else:  # event streams and WebSockets are long-lived: bounded per agent elsewhere
                await self.app(scope, receive, send)
        finally:
            current_agent.reset(token)

    async def _bounded_body(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """``receive`` for a body within the cap (a declared length is trusted: the server never
        delivers more), or None once a 413 has been sent. A chunked body is read here, at most
        the cap, and handed on from memory."""
        declared = _header(scope, b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) <= self.max_body:
                return receive
            await self._too_large(send)
            return None
        if _header(scope, b"transfer-encoding") is None:
            return receive  # no body at all
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return receive  # the client left; the app sees it as it would have
            size += len(message.get("body", b""))
            if size > self.max_body:
                await self._too_large(send)
                return None
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        return replayed

    async def _too_large(self, send: Send) -> None:
        error = RequestTooLarge(f"the request body is larger than {self.max_body} bytes", limit=self.max_body).to_dict()
        body = json.dumps(error).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, body: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        message = await receive()  # websocket.connect
        if message["type"] != "websocket.connect":
            return
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008})


def _agent() -> str:
    agent = current_agent.get()
    if agent is None:  # only reachable if a route is served without the middleware
        raise RuntimeError("no authenticated agent for this request")
    return agent


def request_agent() -> str:
    """The agent of the request being served (set by the auth middleware)."""
    return _agent()


def guarded_mcp_app(server: Any, settings: Settings, *, open_agent: str) -> ASGIApp:
    """``procpilot mcp --http``: the SDK's streamable HTTP app behind the daemon's own checks.

    Bearer tokens (when configured) decide the agent, and on a loopback binding ``Host`` and
    ``Origin`` must be loopback names: the same rules as ``procpilot serve``, because this app
    runs commands just the same.
    """
    loopback = settings.server.loopback_only
    inner = server.streamable_http_app(
        host="127.0.0.1" if loopback else "0.0.0.0",  # noqa: S104 - only the security default is chosen here
        transport_security=_transport_security(loopback),
    )
    auth = TokenAuth(settings.server.tokens, open_agent)
    return AuthMiddleware(inner, auth, loopback_only=loopback)


# -- events ------------------------------------------------------------------------------------

_STATUS = {
    SessionState.QUEUED: "queued",
    SessionState.RUNNING: "running",
    SessionState.EXITED_OK: "done",
    SessionState.KILLED: "killed",
}


def exit_event(info: ExitInfo) -> dict[str, Any]:
    return {
        "type": "exit",
        "sessionId": info.session_id,
        "status": _STATUS.get(info.state, "error"),
        "state": info.state.value,
        "exitCode": info.exit_code,
        "exitSignal": info.exit_signal,
        "durationMs": info.duration_ms,
        "backgrounded": info.backgrounded,
        "command": info.command,
        "tail": info.tail,
        "uri": f"proc://{info.session_id}",
    }


def audit_scope(event: Any) -> str | None:
    """The agent an audit event is about (the gate says ``scope``, the process.* face ``who``)."""
    scope = getattr(event, "scope", None) or getattr(event, "who", None)
    return scope if isinstance(scope, str) else None


def audit_event(event: Any) -> dict[str, Any]:
    """An audit event as JSON, whichever face's dataclass it is (the agent itself is left out)."""
    data = dataclasses.asdict(event) if dataclasses.is_dataclass(event) and not isinstance(event, type) else {}
    data.pop("scope", None)
    data.pop("who", None)
    return {"type": "audit", **{_camel(k): v for k, v in data.items() if not k.startswith("_")}}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


class _EventQueue:
    """One SSE client's events: bounded, oldest dropped first, with a count of what was dropped."""

    def __init__(self, maxsize: int = _EVENT_QUEUE) -> None:
        self.items: deque[tuple[str, dict[str, Any]]] = deque()
        self.maxsize = maxsize
        self.dropped = 0
        self.wakeup = asyncio.Event()

    def put(self, kind: str, data: dict[str, Any]) -> None:
        if len(self.items) >= self.maxsize:
            self.items.popleft()
            self.dropped += 1
        self.items.append((kind, data))
        self.wakeup.set()


def _sse(kind: str, data: Mapping[str, Any], event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return f"{head}event: {kind}\ndata: {body}\n\n".encode()


# -- OpenAPI -----------------------------------------------------------------------------------


def _schema_name(tool: str) -> str:
    parts = tool.replace("-", ".").replace("_", ".").split(".")
    return "".join(part[:1].upper() + part[1:] for part in parts) + "Input"


_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "description": "The error's type, e.g. SessionNotFound."},
        "message": {"type": "string"},
        "hints": {"type": "object", "additionalProperties": {"type": "string"}, "description": "What to do next."},
        "text": {"type": "string", "description": "The same error as a text for a model."},
    },
    "additionalProperties": True,
}
_JSONRPC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["jsonrpc", "error"],
    "properties": {
        "jsonrpc": {"const": "2.0"},
        "id": {},
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "integer"}, "message": {"type": "string"}, "data": {}},
        },
    },
}
_SUCCESS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["text", "data"],
    "properties": {
        "text": {"type": "string", "description": "The result as a text for a model (MCP content)."},
        "data": {"type": "object", "description": "The structured result (MCP structuredContent)."},
    },
}
_HOST_REFUSED = "A non-loopback Host or Origin header on a loopback daemon (DNS rebinding, cross-site requests)."
_STATUS_TEXT = {
    401: "No bearer token, or a wrong one (the body says nothing more).",
    403: "Refused by the agent's policy (PermissionDenied, ApprovalDenied, *Denied), or a non-loopback Host/Origin.",
    404: "SessionNotFound (including another agent's session) or UnknownTool.",
    409: "The session is in the wrong state (ProcessAlreadyExited, SessionStillRunning, StdinClosed).",
    413: "RequestTooLarge: the body is over the daemon's limit (1 MiB by default).",
    415: "The body is not application/json.",
    422: "InvalidArgument and its family; CommandNotFound, PathOutOfScope, ProtectedVariable, LimitAboveAllocation.",
    429: "ProcLimit (the agent runs as many sessions as its policy allows), TooManyConnections.",
    500: "SpawnFailed, KillFailed, or an unexpected failure.",
    501: "NotSupported, IsolationUnavailable.",
    503: "The daemon is shutting down.",
}


def build_openapi(tools: Sequence[ToolSpec], version: str = "0") -> dict[str, Any]:
    """An OpenAPI 3.1 document of the daemon, every tool's request body its input model's schema."""
    schemas: dict[str, Any] = {"ToolResult": _SUCCESS_SCHEMA, "Error": _ERROR_SCHEMA}
    paths: dict[str, Any] = {}
    error_ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for spec in tools:
        schema = spec.input_model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        name = _schema_name(spec.name)
        schemas[name] = schema
        responses: dict[str, Any] = {
            "200": {
                "description": "The tool ran (a failed command is a normal result).",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ToolResult"}}},
            }
        }
        for status in ERROR_STATUSES:
            responses[str(status)] = {"description": _STATUS_TEXT[status], **error_ref}
        paths[f"/v1/tools/{spec.name}"] = {
            "post": {
                "operationId": "tool_" + "".join(c if c.isalnum() else "_" for c in spec.name),
                "summary": spec.name,
                "description": spec.description,
                "tags": ["tools"],
                "x-procpilot-tier": spec.tier.value,
                "requestBody": {
                    "required": False,
                    "description": "The tool's arguments (an empty body is {}).",
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
                },
                "responses": responses,
            }
        }
    # What the auth middleware answers before any route runs: every path can answer these.
    guarded = {
        "401": {"description": _STATUS_TEXT[401], **error_ref},
        "403": {"description": _HOST_REFUSED, **error_ref},
    }
    paths["/v1/tools"] = {
        "get": {
            "operationId": "list_tools",
            "summary": "The tools, their descriptions, tiers and input schemas.",
            "responses": {
                "200": {
                    "description": "Tools",
                    "content": {"application/json": {"schema": {"type": "object", "required": ["tools"]}}},
                },
                **guarded,
            },
        }
    }
    paths["/v1/capabilities"] = {
        "get": {
            "operationId": "capabilities",
            "summary": "Which mechanism serves tree kill, resource limits and isolation on this host.",
            "responses": {
                "200": {
                    "description": (
                        "tree_kill, subreaper, limits {mechanism, enforced, not_enforced, passed_over},"
                        " isolation, pidfd"
                    ),
                    "content": {
                        "application/json": {"schema": {"type": "object", "required": ["tree_kill", "limits"]}}
                    },
                },
                **guarded,
            },
        }
    }
    approval = {"type": "object", "required": ["id", "scope", "tool", "summary", "status"]}
    paths["/v1/approvals"] = {
        "get": {
            "operationId": "list_approvals",
            "summary": "Calls held for approval (status awaiting_approval), of every agent. Approvers only.",
            "responses": {
                "200": {
                    "description": "{approvals: [{id, scope, tool, summary, arguments, created_at, status}]}",
                    "content": {"application/json": {"schema": {"type": "object", "required": ["approvals"]}}},
                },
                **guarded,
                "403": {"description": "ApprovalForbidden: not in [server] approvers. " + _HOST_REFUSED, **error_ref},
                "501": {"description": "No policy gate in this build.", **error_ref},
            },
        }
    }
    paths["/v1/approvals/{request_id}"] = {
        "post": {
            "operationId": "decide_approval",
            "summary": "Approve or deny a held call; every decision is an audit event for the requesting agent.",
            "parameters": [{"name": "request_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["decision"],
                            "properties": {
                                "decision": {"enum": ["approve", "deny"]},
                                "reason": {"type": "string"},
                            },
                            "additionalProperties": False,
                        }
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "{approval: the decided request}",
                    "content": {"application/json": {"schema": {"properties": {"approval": approval}}}},
                },
                **guarded,
                "403": {
                    "description": "ApprovalForbidden (not an approver), SelfApprovalDenied (your own request), "
                    + _HOST_REFUSED,
                    **error_ref,
                },
                "404": {"description": "No pending request with this id (decided, expired or unknown).", **error_ref},
                "415": {"description": _STATUS_TEXT[415], **error_ref},
                "422": {"description": "decision is not approve or deny, or an unknown field.", **error_ref},
                "501": {"description": "No policy gate in this build.", **error_ref},
            },
        }
    }
    paths["/openapi.json"] = {
        "get": {
            "operationId": "openapi",
            "summary": "This document.",
            "responses": {
                "200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}},
                **guarded,
            },
        }
    }
    paths["/v1/events"] = {
        "get": {
            "operationId": "events",
            "summary": "Server-sent events of the caller's scope.",
            "description": (
                "`event: ready` first, then `event: exit` (a session ended: sessionId, status, state, "
                "exitCode, exitSignal, durationMs, tail, uri) and `event: audit` (tool, tier, outcome, "
                "summary), and `event: dropped` ({count}) when a slow reader missed events. Comment lines "
                "keep the connection alive."
            ),
            "responses": {
                "200": {
                    "description": "An event stream",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                **guarded,
            },
        }
    }
    paths["/v1/proc"] = {
        "get": {
            "operationId": "proc_websocket",
            "summary": "WebSocket upgrade: the proc/* protocol (spec 003).",
            "description": (
                "Text frames, one JSON message each: requests {id, method, params} answered by {id, result} "
                "or {id, error}; proc/read/event notifications pushed live, in order. A slow reader gets a "
                "proc/lagged notice naming the byte range it missed (page it with proc/read)."
            ),
            "responses": {
                "101": {"description": "Switching protocols"},
                "404": {"description": "Not a WebSocket upgrade request."},
                **guarded,
            },
        }
    }
    rpc_error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/JsonRpcError"}}}}
    schemas["JsonRpcError"] = _JSONRPC_ERROR_SCHEMA
    mcp_common = {
        "400": {"description": "No or unknown-format Mcp-Session-Id, or a body that is not JSON-RPC.", **rpc_error},
        "404": {"description": "The Mcp-Session-Id names no session (or another token's).", **rpc_error},
        **guarded,
    }
    event_stream = {"content": {"text/event-stream": {"schema": {"type": "string"}}}}
    mcp_summary = "MCP over streamable HTTP (the same tools; resources proc://{sessionId})."
    paths["/mcp"] = {
        "post": {
            "operationId": "mcp_post",
            "summary": mcp_summary,
            "responses": {
                "200": {"description": "JSON-RPC responses, as JSON or an SSE stream"},
                "202": {"description": "A notification or response was accepted"},
                "406": {"description": "Accept must name application/json and text/event-stream.", **rpc_error},
                **mcp_common,
            },
        },
        "get": {
            "operationId": "mcp_get",
            "summary": "The session's standalone SSE stream (server notifications).",
            "responses": {
                "200": {"description": "An event stream", **event_stream},
                "406": {"description": "Accept must name text/event-stream.", **rpc_error},
                **mcp_common,
            },
        },
        "delete": {
            "operationId": "mcp_delete",
            "summary": "End the MCP session.",
            "responses": {"200": {"description": "The session ended"}, **mcp_common},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "procpilot",
            "version": version,
            "description": "A process supervisor for AI agents. The bearer token decides the agent (scope).",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


# -- the daemon --------------------------------------------------------------------------------


ProcHandlerFactory = Callable[[Supervisor, str], Any]  # (supervisor, agent) -> a proc/* handler


class Daemon:
    """Everything behind the app: the tools, the MCP server and its notifications, the streams."""

    def __init__(
        self,
        supervisor: Supervisor,
        tools: Sequence[ToolSpec],
        settings: Settings,
        *,
        audit: EventBus[Any] | None = None,
        proc_handler: ProcHandlerFactory | None = None,
        gate: Any | None = None,
    ) -> None:
        self.sup = supervisor
        self.settings = settings
        self.gate = gate
        self.tools = {spec.name: spec for spec in tools}
        self.audit = audit
        self.proc_handler = proc_handler
        self.closing = asyncio.Event()
        self._queues: set[tuple[str, _EventQueue]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sockets: set[WebSocket] = set()
        self.mcp = _McpFace(self, tools)

    # -- lifecycle --

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        removers = [self.sup.on_exit(self._on_exit)]
        if self.audit is not None:
            removers.append(self.audit.add_callback(self._on_audit))
        async with self.mcp.server.session_manager.run():
            try:
                yield
            finally:
                for remove in removers:
                    remove()
                await self.begin_shutdown()
                for task in list(self._tasks):
                    task.cancel()
                for task in list(self._tasks):
                    with contextlib.suppress(BaseException):
                        await task

    async def begin_shutdown(self) -> None:
        """End every stream a client holds open (SSE, WebSocket, MCP), so the server can stop."""
        if self.closing.is_set():
            return
        self.closing.set()
        for _agent_id, queue in list(self._queues):
            queue.wakeup.set()
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close(1001)
        await self.mcp.close_sessions()

    def spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- events --

    def _on_exit(self, info: ExitInfo) -> None:
        event = exit_event(info)
        for agent, queue in list(self._queues):
            if agent == info.scope:
                queue.put("exit", event)
        self.mcp.session_ended(info)

    def _on_audit(self, event: Any) -> None:
        scope = audit_scope(event)
        if scope is None:
            return
        data = audit_event(event)
        for agent, queue in list(self._queues):
            if agent == scope:
                queue.put("audit", data)

    # -- routes --

    async def list_tools(self, request: Request) -> Response:
        _agent()
        rows = [
            {
                "name": spec.name,
                "description": spec.description,
                "tier": spec.tier.value,
                "inputSchema": spec.input_schema(),
                "meta": spec.meta,
            }
            for spec in self.tools.values()
        ]
        return _json({"tools": rows})

    async def call_tool(self, request: Request) -> Response:
        agent = _agent()
        name = request.path_params["name"]
        spec = self.tools.get(name)
        if spec is None:
            return _error(
                "UnknownTool",
                f"no tool named {name!r}",
                hints={"list_tools": "GET /v1/tools lists the tools; the names are those of MCP."},
            )
        try:
            arguments = await _json_body(request, "the tool's arguments as a JSON object")
        except ProcpilotError as exc:
            return _json(exc.to_dict(), exc.http_status)
        result = await spec.call(arguments, agent)
        if result.is_error:
            code = str(result.data.get("error", "ProcpilotError"))
            return _json({**result.data, "text": result.text}, status_for_error(code))
        return _json({"text": result.text, "data": result.data})

    async def capabilities(self, request: Request) -> Response:
        _agent()
        return _json(self.sup.capabilities())

    def _approver(self) -> tuple[str, Any]:
        """The calling approver and the gate, or the error that says why not."""
        agent = _agent()
        if self.gate is None:
            raise NotSupported("this build has no policy gate: nothing is ever held for approval")
        if agent not in self.settings.server.approvers:
            raise ApprovalForbidden(f"agent {agent!r} is not an approver")
        return agent, self.gate

    async def approvals(self, request: Request) -> Response:
        try:
            _approver, gate = self._approver()
        except ProcpilotError as exc:
            return _json(exc.to_dict(), status_for_error(exc.code))
        return _json({"approvals": [r.public() for r in gate.pending()]})

    async def decide(self, request: Request) -> Response:
        try:
            agent, gate = self._approver()
            request_id = request.path_params["request_id"]
            body = await _json_body(request)
            decision, reason = body.get("decision"), body.get("reason")
            if decision not in ("approve", "deny") or not (reason is None or isinstance(reason, str)):
                raise InvalidArgument('send {"decision": "approve" | "deny", "reason": "..."}', field="decision")
            if set(body) - {"decision", "reason"}:
                raise InvalidArgument(f"unknown fields: {sorted(set(body) - {'decision', 'reason'})}")
            held = next((r for r in gate.pending() if r.id == request_id), None)
            if held is not None and held.scope == agent:
                # Four eyes: an approver who could wave through its own calls would need no approval.
                raise SelfApprovalDenied(f"agent {agent!r} cannot decide its own request {request_id}")
            decided = gate.decide(request_id, decision == "approve", approver=agent, reason=reason)
        except ProcpilotError as exc:
            return _json(exc.to_dict(), status_for_error(exc.code))
        return _json({"approval": decided.public()})

    async def openapi(self, request: Request) -> Response:
        _agent()
        from procpilot.transports.mcp import _version

        return JSONResponse(build_openapi(list(self.tools.values()), _version()))

    async def events(self, request: Request) -> Response:
        agent = _agent()
        queue = _EventQueue()
        entry = (agent, queue)
        self._queues.add(entry)

        async def stream() -> AsyncIterator[bytes]:
            counter = 0
            reported = 0
            try:
                yield b"retry: 3000\n\n" + _sse("ready", {"agent": agent})
                while not self.closing.is_set():
                    if queue.dropped > reported:
                        yield _sse("dropped", {"count": queue.dropped - reported})
                        reported = queue.dropped
                    if queue.items:
                        kind, data = queue.items.popleft()
                        counter += 1
                        yield _sse(kind, data, counter)
                        continue
                    queue.wakeup.clear()
                    try:
                        await asyncio.wait_for(queue.wakeup.wait(), _HEARTBEAT_EVERY)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
            finally:
                self._queues.discard(entry)

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def proc_socket(self, ws: WebSocket) -> None:
        agent = _agent()
        if self.proc_handler is None:
            await ws.close(1011, "the proc/* protocol is not available in this build")
            return
        try:
            handler = self.proc_handler(self.sup, agent)
        except ProcpilotError as exc:
            await ws.close(1011, f"{exc.code}: {exc.message}"[:120])
            return
        open_here = sum(1 for other in self._sockets if other.scope.get("procpilot.agent") == agent)
        if open_here >= self.settings.server.websockets_per_agent:
            handler.close()
            error = TooManyConnections(f"agent {agent!r} already has {open_here} proc/* WebSockets open, its limit")
            await ws.send_denial_response(_json(error.to_dict(), error.http_status))
            return
        await ws.accept()
        ws.scope["procpilot.agent"] = agent
        self._sockets.add(ws)
        try:
            await ProcConnection(ws, self, agent, handler).run(self.closing)
        finally:
            self._sockets.discard(ws)
            if ws.client_state is WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    await ws.close(1001 if self.closing.is_set() else 1000)


# -- WebSocket: the proc/* protocol ------------------------------------------------------------

_WS_QUEUE = 256  # pushed output events one client may lag behind before it is told what it missed
# Requests one connection may have running or answered-but-unsent at once; past it the connection
# is not read from (TCP back-pressure), so at most this many answers (a log page: 1 MiB) wait for it.
_WS_IN_FLIGHT = 16
# One proc/log/resp at most: a page is read, decoded and serialised on the event loop.
_LOG_PAGE = 256 * 1024


class ProcConnection:
    """One WebSocket client of the proc/* protocol (spec 003), for one agent.

    Requests are handled concurrently (a slow ``proc/kill`` does not hold up a ``proc/write``), at
    most ``_WS_IN_FLIGHT`` at once, counting answers not yet sent: a client that never reads is
    not read from either. Responses and pushes leave through one writer, in order.
    Memory is bounded: past ``_WS_QUEUE`` queued output events, further ``proc/read/event`` of a
    process's stream are dropped and folded into one ``proc/lagged/event`` naming the seq and byte
    range missed (sent before anything newer of that stream); ``proc/log/req`` pages any byte range
    from the session's log. Responses, lag notices and exit events are never dropped.

    The daemon adds to spec 003's messages:

        proc/log/req {proc_id, stream_type, offset, limit} -> proc/log/resp {data, offset, next_offset, size}
        proc/exit/event {proc_id, state, exit_code, exit_signal, duration_ms}   after its last read event
        proc/lagged/event {proc_id, stream_type, first_seq, last_seq, events, offset, bytes}
    """

    def __init__(self, ws: WebSocket, daemon: Daemon, agent: str, handler: Any) -> None:
        self.ws = ws
        self.daemon = daemon
        self.agent = agent
        self.handler = handler
        # (message, whether it answers a request): an answer holds its request's slot until it
        # is on the wire, so a client that sends and never reads stops being read from.
        self.outbox: deque[tuple[dict[str, Any], bool]] = deque()
        self.queued_events = 0
        self.lagged: dict[tuple[str, str], dict[str, Any]] = {}
        self.offsets: dict[tuple[str, str], int] = {}  # bytes of each stream pushed or dropped so far
        self.mine: set[str] = set()  # processes spawned on this connection: their exits are pushed
        self.wakeup = asyncio.Event()
        self.slots = asyncio.Semaphore(_WS_IN_FLIGHT)
        self.tasks: set[asyncio.Task[None]] = set()

    # -- out --

    def _queue(self, message: dict[str, Any], *, droppable: bool = False, answer: bool = False) -> None:
        self.outbox.append((message, answer))
        if droppable:
            self.queued_events += 1
        self.wakeup.set()

    def _flush_lag(self, key: tuple[str, str]) -> None:
        notice = self.lagged.pop(key, None)
        if notice is not None:
            self._queue(notice)

    def push(self, event: dict[str, Any]) -> None:
        """From the handler, synchronously, in the order the process printed."""
        if event.get("type") != "proc/read/event":
            self._queue(event)
            return
        key = (str(event.get("proc_id")), str(event.get("stream_type")))
        start = self.offsets.get(key, 0)
        size = len(str(event.get("data", "")).encode())
        self.offsets[key] = start + size
        event["offset"] = start  # byte offset in the stream (exact for valid UTF-8)
        if self.queued_events >= _WS_QUEUE:
            notice = self.lagged.get(key)
            if notice is None:
                notice = self.lagged[key] = {
                    "type": "proc/lagged/event",
                    "proc_id": key[0],
                    "stream_type": key[1],
                    "first_seq": event.get("seq"),
                    "offset": start,
                    "events": 0,
                    "bytes": 0,
                    "hint": "page the missed bytes with proc/log/req (offset, limit=bytes)",
                }
            notice["last_seq"] = event.get("seq")
            notice["events"] += 1
            notice["bytes"] += size
            self.wakeup.set()
            return
        self._flush_lag(key)
        self._queue(event, droppable=True)

    def on_exit(self, info: ExitInfo) -> None:
        if info.session_id not in self.mine:
            return
        self.mine.discard(info.session_id)
        for key in [k for k in self.lagged if k[0] == info.session_id]:
            self._flush_lag(key)
        from procpilot.faces.proc_protocol import PROC_STATE_OF

        self._queue(
            {
                "type": "proc/exit/event",
                "proc_id": info.session_id,
                "state": PROC_STATE_OF[info.state].value,
                "exit_code": info.exit_code,
                "exit_signal": info.exit_signal,
                "duration_ms": info.duration_ms,
            }
        )

    async def writer(self) -> None:
        while True:
            while self.outbox or self.lagged:
                answer = False
                if self.outbox:
                    message, answer = self.outbox.popleft()
                    if message.get("type") == "proc/read/event":
                        self.queued_events -= 1
                else:
                    message = self.lagged.pop(next(iter(self.lagged)))
                text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), default=str)
                del message  # a 1 MiB log page is held once, as text, while the socket drains
                try:
                    await self.ws.send_text(text)
                finally:
                    # A failed send's traceback keeps this frame alive until the cycle collector
                    # runs, which an idle daemon may not do for a long time: keep nothing big in it.
                    del text
                if answer:
                    self.slots.release()
            self.wakeup.clear()
            await self.wakeup.wait()

    # -- in --

    async def reader(self) -> None:
        while True:
            await self.slots.acquire()
            try:
                text = await self.ws.receive_text()
            except (WebSocketDisconnect, RuntimeError, KeyError):
                return
            try:
                request = json.loads(text)
            except ValueError:
                request = None
            if not isinstance(request, dict):
                self._queue(_proc_error(None, "invalid_request", "each frame must be one JSON object"), answer=True)
                continue
            task = asyncio.ensure_future(self._handle(request))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _handle(self, request: dict[str, Any]) -> None:
        try:
            if request.get("type") == "proc/log/req":
                response = self._log(request)
            else:
                response = await self.handler.handle(request)
                if response.get("type") == "proc/spawn/resp" and response.get("proc_id") and not response.get("error"):
                    self.mine.add(str(response["proc_id"]))
                    session = self.daemon.sup.get(self.agent, str(response["proc_id"]))
                    if session.finished:  # ended before we listened (an instant failure)
                        self.on_exit(session.exit_info(""))
        except Exception as exc:  # a bug must answer the request, not end the connection
            _log.exception("proc request failed")
            response = _proc_error(request.get("id"), "internal_error", f"{type(exc).__name__}: {exc}")
        except BaseException:
            self.slots.release()  # cancelled (the connection is closing): no answer will hold it
            raise
        self._queue(response, answer=True)

    def _log(self, request: Mapping[str, Any]) -> dict[str, Any]:
        from procpilot.engine.capture import Stream
        from procpilot.render import complete_utf8_prefix

        rid = request.get("id")
        proc_id = str(request.get("proc_id", ""))
        name = request.get("stream_type", "stdout")
        offset, limit = request.get("offset", 0), request.get("limit", _LOG_PAGE)
        if name not in ("stdout", "stderr") or not isinstance(offset, int) or not isinstance(limit, int):
            problem = "proc/log/req wants stream_type stdout|stderr and int offset, limit"
            return _proc_error(rid, "invalid_request", problem, kind="proc/log/resp")
        try:
            session = self.daemon.sup.get(self.agent, proc_id)
        except SessionNotFound:
            return _proc_error(rid, "unknown_proc", f"no process {proc_id!r}", kind="proc/log/resp")
        result = session.output[Stream(name)].read(max(0, offset), max(0, min(limit, _LOG_PAGE)))
        data = result.data
        if result.end < result.total:
            data = data[: complete_utf8_prefix(data)]
        return {
            "type": "proc/log/resp",
            "id": rid,
            "proc_id": proc_id,
            "stream_type": name,
            "data": data.decode("utf-8", errors="replace"),
            "offset": result.end - len(result.data),
            "next_offset": result.end - (len(result.data) - len(data)),
            "size": result.total,
            "dropped_bytes": result.dropped,
            "finished": session.finished,
        }

    async def run(self, closing: asyncio.Event) -> None:
        unsubscribe = self.handler.subscribe(self.push)
        remove_exit = self.daemon.sup.on_exit(self.on_exit)  # after the handler's: its last events go first
        read_task = asyncio.ensure_future(self.reader())
        write_task = asyncio.ensure_future(self.writer())
        close_task = asyncio.ensure_future(closing.wait())
        try:
            await asyncio.wait({read_task, write_task, close_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            unsubscribe()
            remove_exit()
            for task in (read_task, write_task, close_task, *self.tasks):
                task.cancel()
            for task in (read_task, write_task, close_task, *list(self.tasks)):
                with contextlib.suppress(BaseException):
                    await task
            self.handler.close()  # stops pushing; the processes run on (the supervisor owns them)
            self.outbox.clear()  # what a client that left never read goes now, not at the next GC
            self.lagged.clear()


def _proc_error(rid: Any, code: str, message: str, kind: str = "proc/error") -> dict[str, Any]:
    return {"type": kind, "id": rid, "error": {"code": code, "message": message, "hints": {}}}


# -- MCP ---------------------------------------------------------------------------------------


class _ScopedBus:
    """A subscriptions/listen bus that hears each listener's agent: a session's resource-updated
    event reaches only the listen streams of the agent that owns the session."""

    def __init__(self) -> None:
        self._listeners: dict[object, tuple[str | None, Callable[[Any], None]]] = {}

    async def publish(self, event: Any) -> None:
        self.publish_to(None, event)

    def publish_to(self, agent: str | None, event: Any) -> None:
        for owner, listener in list(self._listeners.values()):
            if agent is not None and owner != agent:
                continue
            try:
                listener(event)
            except Exception:
                _log.exception("subscription listener failed")

    def subscribe(self, listener: Callable[[Any], None]) -> Callable[[], None]:
        key = object()
        self._listeners[key] = (current_agent.get(), listener)

        def unsubscribe() -> None:
            self._listeners.pop(key, None)

        return unsubscribe


_mcp_request: ContextVar[Any] = ContextVar("procpilot_mcp_request", default=None)


class _McpFace:
    """The MCP server of the daemon: the same tools as ``procpilot mcp``, plus exit notifications.

    - ``proc://{sessionId}`` is a resource (the session's status as JSON). When a session ends,
      a resource-updated event goes to the owner's ``subscriptions/listen`` streams (2026-07-28)
      and a ``notifications/resources/updated`` to legacy sessions that subscribed to it
      (``resources/subscribe``), or that started it with ``exec`` and saw it backgrounded: they
      hear it on their standalone GET stream without subscribing.
    - A tool call still running after a second sends progress notifications each second (to
      clients that asked for progress).
    - A call the client cancels stops waiting; it never kills a session.
    """

    def __init__(self, daemon: Daemon, tools: Sequence[ToolSpec]) -> None:
        from mcp.server.subscriptions import ListenHandler
        from mcp_types import SubscribeRequestParams, SubscriptionsListenRequestParams, UnsubscribeRequestParams

        from procpilot.transports.mcp import build_mcp_server

        self.daemon = daemon
        self.bus = _ScopedBus()
        self._legacy: dict[str, list[tuple[str, Any]]] = {}
        wrapped = [self._wrap(spec) for spec in tools]
        self.server = build_mcp_server(wrapped, scope=_agent)
        low = self.server._lowlevel_server
        # The SDK's own bus fans out by URI only; ours also checks the listener's agent.
        self.server._subscriptions = self.bus
        low.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, ListenHandler(self.bus))
        low.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
        low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe)
        self.server.middleware.append(self._capture_request)
        self._add_resource()
        loopback = daemon.settings.server.loopback_only
        self.app = self.server.streamable_http_app(
            host="127.0.0.1" if loopback else "0.0.0.0",  # noqa: S104 - only the security default is chosen here
            transport_security=_transport_security(loopback),
            session_idle_timeout=daemon.settings.server.mcp_session_idle_sec,
        )

    # -- requests --

    async def _capture_request(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        token = _mcp_request.set(ctx)
        try:
            return await call_next(ctx)
        finally:
            _mcp_request.reset(token)

    def _wrap(self, spec: ToolSpec) -> ToolSpec:
        inner = spec.handler

        async def handler(arguments: Mapping[str, Any], scope: str) -> Any:
            ctx = _mcp_request.get()
            if ctx is None:
                return await inner(arguments, scope)
            task = asyncio.ensure_future(inner(arguments, scope))
            started = time.monotonic()
            try:
                while True:
                    done, _ = await asyncio.wait({task}, timeout=_PROGRESS_EVERY)
                    if done:
                        break
                    elapsed = time.monotonic() - started
                    with contextlib.suppress(Exception):
                        await ctx.session.report_progress(
                            round(elapsed, 1), None, f"{spec.name}: still running after {elapsed:.0f} s"
                        )
            finally:
                if not task.done():
                    # The client cancelled: stop waiting. The session itself runs on; only an
                    # explicit kill ends it.
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            result = task.result()
            self._follow(ctx, scope, spec.name, result.data if not result.is_error else {})
            return result

        return dataclasses.replace(spec, handler=handler)

    def _follow(self, ctx: Any, agent: str, tool: str, data: Mapping[str, Any]) -> None:
        """A legacy client that just saw a session backgrounded hears of its end unasked."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        if tool == "process.run":  # spec 000's vocabulary: process_id, and state instead of status
            session_id, running = data.get("process_id"), data.get("state") == "running"
        else:
            session_id, running = data.get("sessionId"), data.get("status") in ("running", "queued")
        if not isinstance(session_id, str) or not running:
            return
        if getattr(ctx, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS:
            return
        self._add_legacy(session_id, agent, ctx.session)

    def _add_legacy(self, session_id: str, agent: str, session: Any) -> None:
        alive = {s.id for s in self.daemon.sup.all_sessions()}
        for known in [k for k in self._legacy if k not in alive]:
            del self._legacy[known]
        listeners = self._legacy.setdefault(session_id, [])
        if not any(s is session for _a, s in listeners):
            listeners.append((agent, session))

    async def _subscribe(self, ctx: Any, params: Any) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import INVALID_PARAMS, EmptyResult

        agent = _agent()
        uri = str(params.uri)
        session_id = uri.removeprefix("proc://")
        try:
            session = self.daemon.sup.get(agent, session_id) if uri.startswith("proc://") else None
        except SessionNotFound:
            session = None
        if session is None:
            raise MCPError(INVALID_PARAMS, f"Resource not found: {uri}", {"uri": uri})
        if session.finished:
            self.daemon.spawn(_notify_legacy(ctx.session, uri))
        else:
            self._add_legacy(session_id, agent, ctx.session)
        return EmptyResult()

    async def _unsubscribe(self, ctx: Any, params: Any) -> Any:
        from mcp_types import EmptyResult

        session_id = str(params.uri).removeprefix("proc://")
        listeners = self._legacy.get(session_id, [])
        self._legacy[session_id] = [(a, s) for a, s in listeners if s._connection is not ctx.session._connection]
        return EmptyResult()

    # -- notifications --

    def session_ended(self, info: ExitInfo) -> None:
        from mcp.shared.subscriptions import ResourceUpdated

        uri = f"proc://{info.session_id}"
        self.bus.publish_to(info.scope, ResourceUpdated(uri=uri))
        for agent, session in self._legacy.pop(info.session_id, []):
            if agent == info.scope:
                self.daemon.spawn(_notify_legacy(session, uri))

    async def close_sessions(self) -> None:
        """End open MCP sessions (their GET streams would keep the server from stopping)."""
        manager = self.server.session_manager
        for transport in list(getattr(manager, "_server_instances", {}).values()):
            with contextlib.suppress(Exception):
                await transport.terminate()

    # -- the resource --

    def _add_resource(self) -> None:
        from mcp.server.mcpserver.exceptions import ResourceNotFoundError

        sup = self.daemon.sup

        @self.server.resource(
            "proc://{sessionId}",
            name="session",
            title="A procpilot session",
            description="A session's status, exit code and the tail of its output; updated when it ends.",
            mime_type="application/json",
        )
        async def read_session(sessionId: str) -> str:  # noqa: N803 - the URI template's variable
            try:
                session = sup.get(_agent(), sessionId)
            except SessionNotFound:
                raise ResourceNotFoundError(f"no session {sessionId!r}") from None
            data = {
                "sessionId": session.id,
                "status": _STATUS.get(session.state, "error"),
                "state": session.state.value,
                "exitCode": session.exit_code,
                "exitSignal": session.exit_signal,
                "durationMs": session.duration_ms,
                "command": session.command,
                "pid": session.pid,
                "tail": sup.tail_text(session),
            }
            return json.dumps(data, ensure_ascii=False)


async def _notify_legacy(session: Any, uri: str) -> None:
    with contextlib.suppress(Exception):
        await session.send_resource_updated(uri)


def _transport_security(loopback: bool) -> Any:
    from mcp.server.transport_security import TransportSecuritySettings

    if not loopback:
        # Bearer tokens are required off the loopback: a browser cannot attach them for a page.
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*_LOOPBACK_HOSTS, *(f"{h}:*" for h in _LOOPBACK_HOSTS)],
        allowed_origins=[f"{s}://{h}{p}" for s in ("http", "https") for h in _LOOPBACK_HOSTS for p in ("", ":*")],
    )


# -- the app -----------------------------------------------------------------------------------


def create_app(
    supervisor: Supervisor,
    tools: Sequence[ToolSpec],
    settings: Settings,
    *,
    audit: EventBus[Any] | None = None,
    open_agent: str = "default",
    proc_handler: ProcHandlerFactory | None = None,
    gate: Any | None = None,
) -> Starlette:
    """The daemon's ASGI app. ``open_agent`` is every caller's agent when no token is configured;
    ``gate`` is the policy gate whose approval requests the approvers decide."""
    daemon = Daemon(supervisor, tools, settings, audit=audit, proc_handler=proc_handler, gate=gate)
    mcp_endpoint = _mcp_endpoint(daemon)
    routes = [
        Route("/v1/tools", daemon.list_tools, methods=["GET"]),
        Route("/v1/tools/{name:path}", daemon.call_tool, methods=["POST"]),
        Route("/v1/events", daemon.events, methods=["GET"]),
        Route("/openapi.json", daemon.openapi, methods=["GET"]),
        Route("/v1/capabilities", daemon.capabilities, methods=["GET"]),
        Route("/v1/approvals", daemon.approvals, methods=["GET"]),
        Route("/v1/approvals/{request_id}", daemon.decide, methods=["POST"]),
        WebSocketRoute("/v1/proc", daemon.proc_socket),
        Route("/mcp", mcp_endpoint, methods=["GET", "POST", "DELETE"]),
    ]
    app = Starlette(routes=routes, lifespan=daemon.lifespan)
    app.state.daemon = daemon
    auth = TokenAuth(settings.server.tokens, open_agent)
    app.add_middleware(
        AuthMiddleware,
        auth=auth,
        loopback_only=settings.server.loopback_only,
        requests_per_agent=settings.server.requests_per_agent,
    )
    return app


def daemon_of(app: Starlette) -> Daemon:
    daemon: Daemon = app.state.daemon
    return daemon


def _mcp_endpoint(daemon: Daemon) -> ASGIApp:
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp

    manager = daemon.mcp.server.session_manager
    return McpSessionCap(StreamableHTTPASGIApp(manager), manager, daemon.settings.server.mcp_sessions_per_agent)


class McpSessionCap:
    """At most ``per_agent`` open MCP sessions per agent: past it, opening one more is a 429.

    The SDK caps sessions only in total, so one agent could fill the daemon for everyone. The
    sessions each agent opened are recorded from the ``mcp-session-id`` of the response that
    opened them, and forgotten once the SDK no longer holds them (closed, or idle past
    ``[server] mcp_session_idle_sec``). The SDK's table of open sessions is private: this class
    is the one place that reads it (tests/transports/test_hardening.py fails if it goes).
    """

    def __init__(self, app: ASGIApp, manager: Any, per_agent: int) -> None:
        self.app = app
        self.manager = manager
        self.per_agent = per_agent
        self.opened: dict[str, set[str]] = {}

    def open_sessions(self, agent: str) -> set[str]:
        live = self.manager._server_instances
        mine = self.opened.get(agent, set())
        mine.intersection_update(live)
        return mine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _header(scope, b"mcp-session-id") is not None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        agent = _agent()
        mine = self.open_sessions(agent)
        if len(mine) >= self.per_agent:
            error = TooManyConnections(
                f"agent {agent!r} already has {len(mine)} MCP sessions open, its limit", limit=self.per_agent
            )
            await _json(error.to_dict(), error.http_status)(scope, receive, send)
            return

        async def recorded(message: Message) -> None:
            if message["type"] == "http.response.start":
                session = dict(message.get("headers", [])).get(b"mcp-session-id")
                if session:
                    self.opened.setdefault(agent, set()).add(session.decode("latin-1"))
            await send(message)

        await self.app(scope, receive, recorded)
