"""MCP transport: every ToolSpec as an MCP tool, on the official SDK's ``MCPServer``.

The advertised input schema is the face's pydantic model, and the client's arguments reach the
face untouched, so validation (and its typed, hinted errors) stays with the face. A
typed failure is an ``isError`` result naming the error; only a malformed request is a protocol
error. Works in both protocol eras the SDK speaks (legacy initialize, and 2026-07-28).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp_types import CallToolResult, TextContent, ToolAnnotations

from procpilot.contract import ToolResult, ToolSpec

__all__ = ["build_mcp_server", "to_call_result"]

_INSTRUCTIONS = (
    "procpilot runs shell commands for you. Use exec for a command; if it is still running after "
    "yieldMs it continues in the background and you get a sessionId. Prefer process wait (blocks "
    "until exit or a pattern) over repeated polls. Exits are announced as updates of the resource "
    "proc://{sessionId}: on MCP 2026-07-28 only to a client that called subscriptions/listen."
)


def to_call_result(result: ToolResult) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=result.text)],
        structured_content=json.loads(json.dumps(result.data, default=str)),
        is_error=result.is_error,
    )


ScopeSource = str | Callable[[], str]


class _FaceTool(Tool):
    """A tool whose arguments reach the face exactly as the client sent them.

    The SDK would validate them against a model built from the function's signature and drop
    any name it does not know, so a misspelt ``timout`` would silently run with the default.
    The face validates instead: unknown names are an ``InvalidArgument`` the model can fix.
    """

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        result = await self.fn(arguments)
        return self.fn_metadata.convert_result(result) if convert_result else result


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
    return tool.model_copy(update={"parameters": spec.input_schema()})


def build_mcp_server(tools: Sequence[ToolSpec], *, scope: ScopeSource, name: str = "procpilot") -> MCPServer:
    """An MCP server whose every call runs in ``scope``: a fixed agent id (stdio), or a function
    that tells the caller's agent for the current request (HTTP, where the bearer token decides)."""
    return MCPServer(
        name,
        instructions=_INSTRUCTIONS,
        version=procpilot_version(),
        tools=[_mcp_tool(spec, scope) for spec in tools],
    )


def procpilot_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("procpilot")
    except PackageNotFoundError:
        return "0"
