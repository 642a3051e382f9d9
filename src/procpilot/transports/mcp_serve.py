"""``procpilot mcp``: one agent's tools on a supervisor of its own, over stdio or streamable HTTP.

The command line parses options and prints; this module runs the server, the way
``serve.serve`` runs the daemon, and shuts down through the same ``serve_until_signal``.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from procpilot.config import Settings
from procpilot.contract import ToolSpec
from procpilot.engine.scopes import conversation_scope
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.all_tools import with_default_tools
from procpilot.faces.exit_notices import ExitNotices
from procpilot.transports.mcp import build_mcp_server, exit_notification
from procpilot.transports.serve import (
    audit_file,
    bind_listeners,
    build_tools,
    make_supervisor,
    record_audit,
    serve_until_signal,
    uvicorn_server,
)

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

__all__ = ["ConversationScopes", "serve_mcp", "stdio_server"]


async def serve_mcp(
    settings: Settings,
    *,
    agent: str,
    keep_sessions: bool,
    http_port: int | None = None,
    announce: Callable[[str], None] = lambda url: None,
) -> None:
    """Serve until the client goes (stdio) or a signal comes; ``http_port`` (0: any) serves HTTP on
    ``settings.server.host`` instead, and ``announce`` hears its URL once it accepts connections."""
    # Keeping sessions makes this agent's servers one lineage: each adopts what the last one left
    # (and two live at once are refused). Without it, nothing changes.
    owner = f"mcp:{agent}" if keep_sessions else None
    settings = with_default_tools(settings)
    async with make_supervisor(settings, owner=owner) as sup:
        tools, audit = build_tools(sup, settings)
        stop_audit = record_audit(audit, audit_file(settings))
        try:
            if http_port is None:
                await _serve_stdio(sup, tools, agent=agent, keep_sessions=keep_sessions)
            else:
                await _serve_http(sup, tools, settings, agent, keep_sessions, http_port, announce)
        finally:
            stop_audit()


async def _serve_stdio(sup: Supervisor, tools: list[ToolSpec], *, agent: str, keep_sessions: bool) -> None:
    from procpilot.transports.mcp_handshake import take
    from procpilot.transports.mcp_stdio import Notification, serve_stdio

    notices, tools, server = stdio_server(sup, tools, agent=agent)
    direct = {spec.name: functools.partial(spec.call, scope=agent) for spec in tools}

    def pushes(deliver: Callable[[Notification], None]) -> Callable[[], None]:
        return notices.listen(lambda scope, notice: deliver(exit_notification(notice)) if scope == agent else None)

    try:
        handshake = take()  # the handshake answered before this server loaded, if it was
        serving = functools.partial(serve_stdio, server, direct, pushes=pushes, handshake=handshake)
        await serve_until_signal(sup, serving, keep=keep_sessions)
    finally:
        notices.close()


def stdio_server(
    sup: Supervisor, tools: list[ToolSpec], *, agent: str
) -> tuple[ExitNotices, list[ToolSpec], MCPServer]:
    """The stdio server of ``tools`` (``build_tools``' own) for ``agent``: its exit notices, the
    tools it serves and its ``MCPServer`` (the handshake's seed is built from the same:
    transports/handshake_seed_build.py)."""
    # Exits are told twice over stdio: pushed as a log notification while the connection is
    # open, and named at the top of the agent's next result (what most clients show a model).
    notices = ExitNotices(sup)
    tools = [notices.wrap(spec) for spec in tools]
    return notices, tools, build_mcp_server(tools, scope=agent)


async def _serve_http(
    sup: Supervisor,
    tools: list[ToolSpec],
    settings: Settings,
    agent: str,
    keep_sessions: bool,
    port: int,
    announce: Callable[[str], None],
) -> None:
    import uvicorn

    from procpilot.transports.connections import guarded_http
    from procpilot.transports.http import guarded_mcp_app, request_agent

    notices = ExitNotices(sup)
    conversations = ConversationScopes(isolate=settings.tools.isolate_conversations, agent=request_agent)
    server = build_mcp_server([notices.wrap(spec) for spec in tools], scope=conversations.scope)
    server.middleware.append(conversations.capture)
    # The daemon's own binding (listening before the URL is announced, so a client that reads it
    # can connect at once) and its uvicorn, which leaves signals to us.
    sockets, address = bind_listeners(settings.server.model_copy(update={"port": port, "unix_socket": None}), tcp=True)
    app = guarded_mcp_app(server, settings, open_agent=agent)
    try:
        http = guarded_http(settings.server)
        uvicorn_ = uvicorn_server(uvicorn.Config(app, log_level="warning", http=http, proxy_headers=False))
        announce(f"{address.url}/mcp")
        stop = functools.partial(setattr, uvicorn_, "should_exit", True)
        await serve_until_signal(sup, functools.partial(uvicorn_.serve, sockets=sockets), stop, keep=keep_sessions)
    finally:
        notices.close()
        for listener in sockets:
            listener.close()


class ConversationScopes:
    """The scope of each MCP request over HTTP: its agent's, or with ``[tools]
    isolate_conversations`` its MCP session's own (engine/scopes.py), as the daemon's ``/mcp``
    has it. Over stdio a server is one conversation, so its agent's scope is already that
    conversation's; over ``--http`` many clients share the server, and each session id is one.
    A request without a session id (stateless) acts as the agent: there is no conversation to
    keep it to. ``capture`` is the server middleware that makes the request visible to ``scope``
    (the SDK runs a session's calls in its own task, where the HTTP request's context is not)."""

    def __init__(self, *, isolate: bool, agent: Callable[[], str]) -> None:
        self._isolate = isolate
        self._agent = agent
        self._request: contextvars.ContextVar[Any] = contextvars.ContextVar("procpilot_mcp_http_request")

    def scope(self) -> str:
        agent = self._agent()
        if not self._isolate:
            return agent
        headers = getattr(getattr(self._request.get(None), "request", None), "headers", None)
        conversation = headers.get("mcp-session-id") if headers is not None else None
        return conversation_scope(agent, conversation) if isinstance(conversation, str) and conversation else agent

    async def capture(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        token = self._request.set(ctx)
        try:
            return await call_next(ctx)
        finally:
            self._request.reset(token)
