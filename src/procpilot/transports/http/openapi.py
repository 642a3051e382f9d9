"""The OpenAPI 3.1 document, built from the tools' input models and the error tree."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from procpilot import chat_context
from procpilot.contract import ToolSpec
from procpilot.transports.http.common import ERROR_STATUSES

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
    408: "RequestTimeout: the body did not arrive within [server] body_timeout_sec; the connection is closed.",
    409: "The session is in the wrong state (ProcessAlreadyExited, SessionStillRunning, StdinClosed).",
    413: "RequestTooLarge: the body is over the daemon's limit (1 MiB by default).",
    415: "The body is not application/json.",
    422: "InvalidArgument and its family; CommandNotFound, PathOutOfScope, ProtectedVariable, LimitAboveAllocation.",
    429: "ProcLimit (the agent runs as many sessions as its policy allows), TooManyConnections.",
    500: "SpawnFailed, KillFailed, or an unexpected failure.",
    501: "NotSupported, IsolationUnavailable.",
    503: "The daemon is shutting down.",
}


_ERROR_BODY = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_RPC_ERROR_BODY = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/JsonRpcError"}}}}
_EVENT_STREAM = {"content": {"text/event-stream": {"schema": {"type": "string"}}}}


def _object(*required: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"type": "object", "required": list(required)}}}}


@dataclass(frozen=True, slots=True)
class _Operation:
    """One operation of the document: its responses as status -> (description, body), where a body
    is one of the module's content mappings (or None for no body)."""

    path: str
    method: str
    operation_id: str
    summary: str
    responses: Mapping[str, tuple[str, Mapping[str, Any] | None]]
    description: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # parameters, requestBody
    guarded: bool = True  # the auth middleware's 401 and 403 apply (every route but none)

    def render(self) -> dict[str, Any]:
        responses = {status: {"description": text, **(body or {})} for status, (text, body) in self.responses.items()}
        if self.guarded:
            # What the auth middleware answers before any route runs; a route's own text wins.
            responses = {
                **responses,
                "401": responses.get("401", {"description": _STATUS_TEXT[401], **_ERROR_BODY}),
                "403": responses.get("403", {"description": _HOST_REFUSED, **_ERROR_BODY}),
            }
        operation: dict[str, Any] = {"operationId": self.operation_id, "summary": self.summary}
        if self.description is not None:
            operation["description"] = self.description
        return {**operation, **self.extra, "responses": responses}


_APPROVAL = {"type": "object", "required": ["id", "scope", "tool", "summary", "status"]}
_NO_GATE = ("No policy gate in this build.", _ERROR_BODY)
_MCP_COMMON: dict[str, tuple[str, Mapping[str, Any] | None]] = {
    "400": ("No or unknown-format Mcp-Session-Id, or a body that is not JSON-RPC.", _RPC_ERROR_BODY),
    "404": ("The Mcp-Session-Id names no session (or another token's).", _RPC_ERROR_BODY),
    # Refused before the MCP server reads the request: the typed error in a JSON-RPC error's data.
    "401": (_STATUS_TEXT[401], _RPC_ERROR_BODY),
    "403": (_HOST_REFUSED, _RPC_ERROR_BODY),
    "408": (_STATUS_TEXT[408], _RPC_ERROR_BODY),
    "413": (_STATUS_TEXT[413], _RPC_ERROR_BODY),
}
_MCP_SUMMARY = "MCP over streamable HTTP (the same tools; resources proc://{sessionId})."

_AGENT_PARAMETER = {
    "name": "agent",
    "in": "query",
    "required": False,
    "description": "Act in this agent's scope: [server] operators only (others: 403 OperatorForbidden).",
    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
}

_CONTEXT_PARAMETER = {
    "name": chat_context.HEADER,
    "in": "header",
    "required": False,
    "description": (
        "The chat the call comes from, as its caller says: 'provider=NAME session=KEY' (either part, each "
        f"once, 1-{chat_context.MAX_VALUE} characters of letters, digits and . _ : @ + # / -); recorded "
        "on the call's audit event. Malformed: 422 InvalidArgument, nothing runs."
    ),
    "schema": {"type": "string", "maxLength": chat_context.MAX_HEADER},
}

# Every route but the tools' own, in the order of the document.
_ROUTES = (
    _Operation(
        "/v1/tools",
        "get",
        "list_tools",
        "The tools, their descriptions, tiers and input schemas.",
        {"200": ("Tools", _object("tools"))},
    ),
    _Operation(
        "/v1/capabilities",
        "get",
        "capabilities",
        "Which mechanism serves tree kill, resource limits and isolation on this host.",
        {
            "200": (
                "tree_kill, subreaper, limits {mechanism, enforced, not_enforced, passed_over},"
                " cpu_fairness {between_agents, mechanism or why}, isolation, pidfd,"
                " state_dir, restarts {survive, owner, holder or why, not_held, unreturned}",
                _object("tree_kill", "limits"),
            )
        },
    ),
    _Operation(
        "/v1/sessions",
        "get",
        "list_sessions",
        "The process tool's list for an agent (default: the caller), each row with its agent; another agent's, "
        "or every agent's with agent=*, for approvers only.",
        {
            "200": ("{sessions: [process list rows, each with agent]}", _object("sessions")),
            "403": ("ApprovalForbidden: another agent's sessions, not an approver. " + _HOST_REFUSED, _ERROR_BODY),
            "501": ("The process tool is not served ([tools] serve).", _ERROR_BODY),
        },
        extra={"parameters": [{"name": "agent", "in": "query", "required": False, "schema": {"type": "string"}}]},
    ),
    _Operation(
        "/v1/approvals",
        "get",
        "list_approvals",
        "Calls held for approval (status awaiting_approval), of every agent. Approvers only.",
        {
            "200": ("{approvals: [{id, scope, tool, summary, arguments, created_at, status}]}", _object("approvals")),
            "403": ("ApprovalForbidden: not in [server] approvers. " + _HOST_REFUSED, _ERROR_BODY),
            "501": _NO_GATE,
        },
    ),
    _Operation(
        "/v1/approvals/{request_id}",
        "post",
        "decide_approval",
        "Approve or deny a held call; every decision is an audit event for the requesting agent.",
        {
            "200": (
                "{approval: the decided request}",
                {"content": {"application/json": {"schema": {"properties": {"approval": _APPROVAL}}}}},
            ),
            "403": (
                "ApprovalForbidden (not an approver), SelfApprovalDenied (your own request), " + _HOST_REFUSED,
                _ERROR_BODY,
            ),
            "404": ("No pending request with this id (decided, expired or unknown).", _ERROR_BODY),
            "415": (_STATUS_TEXT[415], _ERROR_BODY),
            "422": ("decision is not approve or deny, or an unknown field.", _ERROR_BODY),
            "501": _NO_GATE,
        },
        extra={
            "parameters": [{"name": "request_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["decision"],
                            "properties": {"decision": {"enum": ["approve", "deny"]}, "reason": {"type": "string"}},
                            "additionalProperties": False,
                        }
                    }
                },
            },
        },
    ),
    _Operation(
        "/openapi.json",
        "get",
        "openapi",
        "This document.",
        {"200": ("OpenAPI 3.1", {"content": {"application/json": {"schema": {"type": "object"}}}})},
    ),
    _Operation(
        "/v1/events",
        "get",
        "events",
        "Server-sent events of the caller's scope.",
        {"200": ("An event stream", _EVENT_STREAM)},
        description=(
            "`event: ready` first, then `event: exit` (a session ended: sessionId, status, state, "
            "exitCode, exitSignal, durationMs, tail, uri) and `event: audit` (tool, tier, outcome, "
            "summary), and `event: dropped` ({count}) when a slow reader missed events. Comment lines "
            "keep the connection alive."
        ),
        extra={"parameters": [_AGENT_PARAMETER]},
    ),
    _Operation(
        "/v1/proc",
        "get",
        "proc_websocket",
        "WebSocket upgrade: the proc/* protocol (spec 003).",
        {"101": ("Switching protocols", None), "404": ("Not a WebSocket upgrade request.", None)},
        description=(
            "Text frames, one JSON message each: requests {id, method, params} answered by {id, result} "
            "or {id, error}; proc/read/event notifications pushed live, in order. A slow reader gets a "
            "proc/lagged notice naming the byte range it missed (page it with proc/read)."
        ),
    ),
    _Operation(
        "/mcp",
        "post",
        "mcp_post",
        _MCP_SUMMARY,
        {
            "200": ("JSON-RPC responses, as JSON or an SSE stream", None),
            "202": ("A notification or response was accepted", None),
            "406": ("Accept must name application/json and text/event-stream.", _RPC_ERROR_BODY),
            **_MCP_COMMON,
        },
    ),
    _Operation(
        "/mcp",
        "get",
        "mcp_get",
        "The session's standalone SSE stream (server notifications).",
        {
            "200": ("An event stream", _EVENT_STREAM),
            "406": ("Accept must name text/event-stream.", _RPC_ERROR_BODY),
            **_MCP_COMMON,
        },
    ),
    _Operation(
        "/mcp", "delete", "mcp_delete", "End the MCP session.", {"200": ("The session ended", None), **_MCP_COMMON}
    ),
)


def _tool_operation(spec: ToolSpec, schema_name: str) -> dict[str, Any]:
    """``POST /v1/tools/{name}``: the request body is the tool's input model."""
    responses: dict[str, tuple[str, Mapping[str, Any] | None]] = {
        "200": (
            "The tool ran (a failed command is a normal result).",
            {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ToolResult"}}}},
        ),
        **{str(status): (_STATUS_TEXT[status], _ERROR_BODY) for status in ERROR_STATUSES},
    }
    operation = _Operation(
        f"/v1/tools/{spec.name}",
        "post",
        "tool_" + "".join(c if c.isalnum() else "_" for c in spec.name),
        spec.name,
        responses,
        description=spec.description,
        extra={
            "tags": ["tools"],
            "x-procpilot-tier": spec.tier.value,
            "parameters": [_AGENT_PARAMETER, _CONTEXT_PARAMETER],
            "requestBody": {
                "required": False,
                "description": "The tool's arguments (an empty body is {}).",
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}},
            },
        },
        guarded=False,  # its own statuses already list 401 and 403
    )
    return operation.render()


def build_openapi(tools: Sequence[ToolSpec], version: str = "0") -> dict[str, Any]:
    """An OpenAPI 3.1 document of the daemon, every tool's request body its input model's schema."""
    schemas: dict[str, Any] = {"ToolResult": _SUCCESS_SCHEMA, "Error": _ERROR_SCHEMA}
    paths: dict[str, dict[str, Any]] = {}
    for spec in tools:
        schema = spec.input_model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        name = _schema_name(spec.name)
        schemas[name] = schema
        paths[f"/v1/tools/{spec.name}"] = {"post": _tool_operation(spec, name)}
    for route in _ROUTES:
        paths.setdefault(route.path, {})[route.method] = route.render()
    schemas["JsonRpcError"] = _JSONRPC_ERROR_SCHEMA
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
