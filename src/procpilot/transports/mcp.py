"""MCP transport: every ToolSpec as an MCP tool, on the official SDK's ``MCPServer``.

The advertised input schema is the face's pydantic model; the SDK-level signature accepts every
field as optional ``Any`` so validation (and its typed, hinted errors) stays with the face. A
typed failure is an ``isError`` result naming the error; only a malformed request is a protocol
error. Works in both protocol eras the SDK speaks (legacy initialize, and 2026-07-28).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp_types import CallToolResult, TextContent, ToolAnnotations

from procpilot.faces.tooling import ToolResult, ToolSpec

__all__ = ["build_mcp_server", "to_call_result"]

_INSTRUCTIONS = (
    "procpilot runs shell commands for you. Use exec for a command; if it is still running after "
    "yieldMs it continues in the background and you get a sessionId. Prefer process wait (blocks "
    "until exit or a pattern) over repeated polls."
)


def to_call_result(result: ToolResult) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=result.text)],
        structured_content=json.loads(json.dumps(result.data, default=str)),
        is_error=result.is_error,
    )


ScopeSource = str | Callable[[], str]


def _mcp_tool(spec: ToolSpec, scope: ScopeSource) -> Tool:
    fields = list(spec.input_model.model_fields)

    async def call(**arguments: Any) -> CallToolResult:
        caller = scope if isinstance(scope, str) else scope()
        return to_call_result(await spec.call(arguments, caller))

    # The SDK builds its argument model from the signature: every field optional and untyped,
    # so the face's own validation produces the errors an agent sees.
    call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Any) for n in fields],
        return_annotation=CallToolResult,
    )
    call.__annotations__ = {n: Any for n in fields} | {"return": CallToolResult}
    tool = Tool.from_function(
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
        version=_version(),
        tools=[_mcp_tool(spec, scope) for spec in tools],
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("procpilot")
    except PackageNotFoundError:
        return "0"
