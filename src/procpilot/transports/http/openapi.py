"""The OpenAPI 3.1 document, built from the tools' input models and the error tree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
