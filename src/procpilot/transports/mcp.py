"""MCP transport: every ToolSpec as an MCP tool, on the official SDK's ``MCPServer``.

The advertised input schema is the face's pydantic model in its lean form (or the strict form
chosen for OpenAI clients: faces/definitions.served_schema), and the client's arguments reach the
face untouched, so validation (and its typed, hinted errors) stays with the face. A
typed failure is an ``isError`` result naming the error; only a malformed request is a protocol
error. Works in both protocol eras the SDK speaks (legacy initialize, and 2026-07-28).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp_types import CallToolResult, ToolAnnotations

from procpilot import chat_context, wire
from procpilot.contract import ToolResult, ToolSpec, error_result
from procpilot.errors import ProcpilotError
from procpilot.faces.definitions import RESULT_SCHEMA, served_schema
from procpilot.faces.exit_notices import exit_line
from procpilot.transports.mcp_results import call_result

__all__ = ["build_mcp_server", "exit_notification", "server_instructions", "to_call_result"]

# The first 200 characters are what a client with a tool search shows a model (Claude Code and
# Codex cut there): what the server is for, true for every client and every tool set.
_PURPOSE = (
    "procpilot runs shell commands and supervises long-running ones (dev servers, builds, watchers) "
    "in the background: output kept on disk, whole process trees ended on kill or timeout."
)
_EXEC_GUIDE = (
    " Use exec for a command; one still running after yieldMs goes on in the background with a "
    "sessionId. Then process wait (until exit or a pattern) rather than repeated polls; process log "
    "reads output a result cut. A background session's exit heads your next result (a line, and "
    "the structured exits list) unless a result already showed it ended."
)
_RUN_GUIDE = (
    " Use process.run for a command (background=true for a long-running one), process.monitor and "
    "process.logs to follow it, process.kill to end it."
)


def server_instructions(names: Sequence[str]) -> str:
    """The server's instructions for a server of the tools ``names``: its purpose, then how to
    use the tools it serves (never a tool it does not serve)."""
    text = _PURPOSE
    if "exec" in names:
        text += _EXEC_GUIDE if "process" in names else " Use exec for a command; it returns when it ends."
    elif any(name.replace("_", ".", 1) == "process.run" for name in names):
        text += _RUN_GUIDE if "process.run" in names else _RUN_GUIDE.replace("process.", "process_")
    return text


_HANDSHAKE = "2025-06-18"  # any handshake-era version: their results are shaped alike


def to_call_result(result: ToolResult) -> CallToolResult:
    # The shape of mcp_results (every path's), for a handshake-era version: the SDK adds the
    # 2026-07-28 envelope itself. Through wire: the SDK writes the result with pydantic, which
    # raises on a lone surrogate (a file name decoded with surrogateescape, an agent's text
    # quoted in an error) and knows no path or datetime.
    return CallToolResult.model_validate(json.loads(wire.dumps(call_result(result, _HANDSHAKE))))


def exit_notification(notice: Mapping[str, Any]) -> dict[str, Any]:
    """A session's exit as an MCP log notification (``notifications/message``): the one
    server-to-client message every client era takes unasked; ``data`` is the exit as the
    structured ``exits`` list holds it, plus its text line."""
    return {
        "method": "notifications/message",
        "params": {"level": "notice", "logger": "procpilot/exit", "data": {**notice, "text": exit_line(notice)}},
    }


ScopeSource = str | Callable[[], str]


class _FaceTool(Tool):
    """A tool whose arguments reach the face exactly as the client sent them.

    The SDK would validate them against a model built from the function's signature and drop
    any name it does not know, so a misspelt ``timout`` would silently run with the default.
    The face validates instead: unknown names are an ``InvalidArgument`` the model can fix.
    """

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        # The chat the call comes from, when the request's _meta says (procpilot/chat_context.py);
        # a malformed one is the call's typed error, as a bad argument is.
        try:
            chat = chat_context.from_meta(_request_meta(context))
        except ProcpilotError as exc:
            result = to_call_result(error_result(exc))
        else:
            with chat_context.calling_from(chat):
                result = await self.fn(arguments)
        return self.fn_metadata.convert_result(result) if convert_result else result


def _request_meta(context: Any) -> Mapping[str, Any] | None:
    """The ``_meta`` of the request being served (None outside a request, or without one)."""
    try:
        meta = context.request_context.meta
    except (AttributeError, ValueError):  # no Context, or the SDK's outside a request (it raises)
        return None
    return meta if isinstance(meta, Mapping) else None


def _mcp_tool(spec: ToolSpec, scope: ScopeSource) -> Tool:
    async def call(arguments: dict[str, Any]) -> CallToolResult:
        caller = scope if isinstance(scope, str) else scope()
        return to_call_result(await spec.call(arguments, caller))

    tool = _FaceTool.from_function(
        call,
        name=spec.name,
        description=spec.description,
        annotations=ToolAnnotations(title=spec.name, destructive_hint=spec.tier.value != "autonomous"),
        meta={"procpilot/permission": spec.tier.value, **spec.meta},
    )
    update: dict[str, Any] = {"parameters": served_schema(spec)}
    if not spec.text_only:  # the open result schema: what a client showing structured content learns
        update["fn_metadata"] = tool.fn_metadata.model_copy(update={"output_schema": RESULT_SCHEMA})
    return tool.model_copy(update=update)


def build_mcp_server(tools: Sequence[ToolSpec], *, scope: ScopeSource, name: str = "procpilot") -> MCPServer:
    """An MCP server whose every call runs in ``scope``: a fixed agent id (stdio), or a function
    that tells the caller's agent for the current request (HTTP, where the bearer token decides)."""
    return MCPServer(
        name,
        # A harness profile's tools (text only) are the model's own: no word of exec or process.
        instructions=None if any(spec.text_only for spec in tools) else server_instructions([s.name for s in tools]),
        version=procpilot_version(),
        tools=[_mcp_tool(spec, scope) for spec in tools],
    )


def procpilot_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("procpilot")
    except PackageNotFoundError:
        return "0"
