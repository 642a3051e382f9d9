"""The one place that reaches into the MCP SDK's private attributes.

The SDK gives no public way to (a) add request handlers on an ``MCPServer`` (its low-level server),
(b) replace the resource-subscription bus with one that also checks the listener's agent,
(c) see which streamable-HTTP sessions are open (to end them at shutdown and to cap them per
agent), or (d) make the message streams its transports hand the low-level server (for a stdio
transport without threads, transports/mcp_stdio.py). Everything that needs these goes through the
functions below, the SDK is pinned to the minor version they were written against
(``mcp>=2.3,<2.4`` in pyproject.toml), and ``tests/transports/test_mcp_sdk.py`` fails as soon as
an SDK release moves any of them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["context_streams", "lowlevel_server", "open_sessions", "use_subscription_bus"]


def lowlevel_server(server: Any) -> Any:
    """The ``mcp.server.lowlevel.Server`` under an ``MCPServer`` (where request handlers go)."""
    return server._lowlevel_server


def use_subscription_bus(server: Any, bus: Any) -> None:
    """Make ``bus`` the server's resource-subscription bus (publish/subscribe by URI)."""
    server._subscriptions = bus


def open_sessions(manager: Any) -> dict[str, Any]:
    """The open sessions of a ``StreamableHTTPSessionManager``: session id -> its transport."""
    sessions: dict[str, Any] = manager._server_instances
    return sessions


def context_streams(size: int) -> tuple[Any, Any]:
    """A (send, receive) pair of the memory streams the SDK's transports give its server."""
    from mcp.shared._context_streams import create_context_streams

    return create_context_streams[Any](size)
