"""The MCP SDK internals the daemon relies on are still where transports/mcp_sdk.py reads
them: this fails as soon as an SDK release moves one, before a daemon misbehaves."""

from __future__ import annotations

import math

from mcp.server.lowlevel import Server
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from procpilot.transports import mcp_sdk
from procpilot.transports.mcp import build_mcp_server


def test_the_low_level_server_takes_request_handlers() -> None:
    server = build_mcp_server([], scope=lambda: "a")
    low = mcp_sdk.lowlevel_server(server)
    assert isinstance(low, Server)
    assert callable(low.add_request_handler)


def test_the_subscription_bus_can_be_replaced() -> None:
    server = build_mcp_server([], scope=lambda: "a")
    before = server._subscriptions  # the attribute exists before we replace it
    bus = object()
    mcp_sdk.use_subscription_bus(server, bus)
    assert before is not bus and server._subscriptions is bus


def test_open_sessions_is_the_managers_table() -> None:
    server = build_mcp_server([], scope=lambda: "a")
    server.streamable_http_app()
    manager = server.session_manager
    assert isinstance(manager, StreamableHTTPSessionManager)
    assert mcp_sdk.open_sessions(manager) == {}


async def test_context_streams_carry_messages() -> None:
    send, receive = mcp_sdk.context_streams(1)
    async with send, receive:
        await send.send("message")
        assert await receive.receive() == "message"


def test_session_owners_are_the_managers_table() -> None:
    server = build_mcp_server([], scope=lambda: "a")
    server.streamable_http_app()
    assert mcp_sdk.session_owner(server.session_manager, "no-such-session") is None
    assert mcp_sdk.requestor({}) is None


async def test_a_busy_session_holds_its_idle_countdown() -> None:
    transport = StreamableHTTPServerTransport(mcp_session_id="s", idle_timeout=60)
    async with transport.connect():
        assert transport.idle_scope is not None
        with mcp_sdk.session_busy(transport) as held:
            assert held and transport.idle_scope.deadline == math.inf
        assert transport.idle_scope.deadline < math.inf
        await transport.terminate()
        with mcp_sdk.session_busy(transport) as held:
            assert not held
