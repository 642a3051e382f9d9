"""The Starlette app: every route behind the auth middleware."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp, Scope

from procpilot.config import Settings
from procpilot.contract import ToolSpec
from procpilot.engine.events import EventBus
from procpilot.engine.supervisor import Supervisor
from procpilot.transports.http.auth import AuthMiddleware, TokenAuth
from procpilot.transports.http.browser_auth import BrowserAuth
from procpilot.transports.http.console import Console
from procpilot.transports.http.daemon import Daemon, ProcHandlerFactory
from procpilot.transports.http.rest import Rest

# -- the app -----------------------------------------------------------------------------------


def create_app(
    supervisor: Supervisor,
    tools: Sequence[ToolSpec],
    settings: Settings,
    *,
    audit: EventBus[Any] | None = None,
    audit_file: Path | None = None,
    open_agent: str = "default",
    proc_handler: ProcHandlerFactory | None = None,
    gate: Any | None = None,
) -> Starlette:
    """The daemon's ASGI app. ``open_agent`` is every caller's agent when no token is configured;
    ``gate`` is the policy gate whose approval requests the approvers decide; ``audit_file`` where
    the ``audit`` events are written (the console shows its tail)."""
    daemon = Daemon(
        supervisor, tools, settings, audit=audit, audit_file=audit_file, proc_handler=proc_handler, gate=gate
    )
    auth = TokenAuth(settings.server.tokens, open_agent)
    server = settings.server
    browser = BrowserAuth()
    console = Console(daemon, auth, browser)
    mcp = daemon.mcp.endpoint()
    rest = Rest(daemon)
    routes = [
        # First: the router tries each route's pattern in turn, and MCP calls are the most frequent.
        Route("/mcp", mcp, methods=["GET", "POST", "DELETE"]),
        *rest.routes(),
        *console.routes(),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with daemon.lifespan(app), console.attached():
            yield

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.daemon = daemon
    app.add_middleware(
        AuthMiddleware,
        auth=auth,
        loopback_only=server.loopback_only,
        requests_per_agent=server.requests_per_agent,
        body_timeout=server.body_timeout_sec,
        browser=browser,
        turns=daemon.turns,
        calls=call_routes(mcp, rest.tool_call),
    )
    return app


def call_routes(mcp: ASGIApp, tool_call: ASGIApp) -> Callable[[Scope], ASGIApp | None]:
    """The app of an agent's POST the router would give ``mcp`` (``/mcp``) or ``tool_call``
    (``/v1/tools/{name:path}``, its ``name`` set as the router sets it), found from the path
    alone; None for every other path, which the router serves.

    Both apps are plain ASGI apps that raise no HTTPException, so the router and the exception
    layer would only pass the request through. A path with a line feed is left to the router:
    its patterns end with ``$``, which matches before a trailing one."""

    def route(scope: Scope) -> ASGIApp | None:
        path: str = scope["path"]
        if scope.get("root_path") or "\n" in path:
            return None
        if path == "/mcp":
            return mcp
        if path.startswith(_TOOLS):
            scope["path_params"] = {"name": path[len(_TOOLS) :]}
            return tool_call
        return None

    return route


_TOOLS = "/v1/tools/"


def daemon_of(app: Starlette) -> Daemon:
    daemon: Daemon = app.state.daemon
    return daemon
