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
    /console/               the web console for people (console.py; / redirects there)

Every request carries ``Authorization: Bearer <token>``; the token alone decides the caller's
agent (its scope), never a request field. A missing or wrong token is a bare 401. With no tokens
configured (loopback only) every caller is the one ``open_agent``. A browser on the console
presents a console session instead (a secret header bound to a cookie: ``browser_auth.py``); an
operator (``[server] operators``) may act in another agent's scope with ``?agent=`` (tool calls
and the event stream). On a
loopback binding the ``Host`` and ``Origin`` headers must name the loopback too, so a web page
cannot reach the daemon through DNS rebinding or a cross-site form post.

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

from procpilot.transports.http.app import create_app, daemon_of
from procpilot.transports.http.auth import TokenAuth
from procpilot.transports.http.common import WS_MAX_MESSAGE, current_agent, request_agent, status_for_error
from procpilot.transports.http.daemon import Daemon
from procpilot.transports.http.mcp_http import guarded_mcp_app
from procpilot.transports.http.openapi import build_openapi

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
