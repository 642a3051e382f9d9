"""The one place that reaches into the MCP SDK's private attributes.

The SDK gives no public way to (a) add request handlers on an ``MCPServer`` (its low-level server),
(b) replace the resource-subscription bus with one that also checks the listener's agent,
(c) see which streamable-HTTP sessions are open (to end them at shutdown and to cap them per
agent), (d) make the message streams its transports hand the low-level server (for a stdio
transport without threads, transports/mcp_stdio.py), or, for a call on ``/mcp`` answered without
its dispatch (transports/http/mcp_fast.py), (e) tell who opened a session, (f) reach the
connection a request's session belongs to, or (g) hold a session's idle countdown while a request
is served, as its transport does for the requests it serves. Everything that needs these goes through the
functions below, the SDK is pinned to the minor version they were written against
(``mcp>=2.3,<2.4`` in pyproject.toml), and ``tests/transports/test_mcp_sdk.py`` fails as soon as
an SDK release moves any of them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import anyio

__all__ = [
    "context_streams",
    "lowlevel_server",
    "open_sessions",
    "request_connection",
    "requestor",
    "session_busy",
    "session_owner",
    "use_subscription_bus",
]


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


def session_owner(manager: Any, session_id: str) -> Any:
    """Who opened the session (compared with ``requestor``): the SDK answers a request for it
    from anyone else as if it did not exist."""
    return manager._session_owners.get(session_id)


def requestor(scope: Any) -> Any:
    """The identity a request presents, as the session manager reads it from the ASGI scope."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context

    user = scope.get("user")
    return authorization_context(user) if isinstance(user, AuthenticatedUser) else None


def request_connection(ctx: Any) -> Any:
    """The ``Connection`` (one per client session) of a request handler's context: what the
    session's negotiated version, its initialisation and its standalone stream belong to."""
    return ctx.session._connection


@contextlib.contextmanager
def session_busy(transport: Any) -> Iterator[bool]:
    """A request of the session's is being served: its idle countdown waits, as the transport's
    ``handle_request`` makes it wait. Yields False (nothing held) once the session is ending:
    terminated, or its idle time already up."""
    idle, timeout = transport.idle_scope, transport._idle_timeout
    if transport.is_terminated or (idle is not None and idle.cancel_called):
        yield False
        return
    if idle is None or timeout is None:
        yield True
        return
    transport._requests_in_flight += 1
    idle.deadline = math.inf
    try:
        yield True
    finally:
        transport._requests_in_flight -= 1
        if not transport._requests_in_flight:
            idle.deadline = anyio.current_time() + timeout
