"""transports/http/daemon.py, app.py and rest.py: the state behind every route, the app built on
it, and the routes that read it; in this process, over a real supervisor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from procpilot.config import load_settings
from procpilot.transports.http.app import daemon_of
from procpilot.transports.http.daemon import Daemon
from procpilot.transports.http.events import EventQueue
from procpilot.transports.http.openapi import build_openapi
from procpilot.transports.http.rest import Rest
from procpilot.transports.serve import audit_file, daemon_app, make_supervisor
from tests.daemon import TOKENS, daemon_env, write_config


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Starlette]:
    settings = load_settings(write_config(tmp_path, TOKENS), env=daemon_env(tmp_path))
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    async with make_supervisor(settings) as sup, daemon_app(sup, settings) as app:
        yield app


def paths(routes: list[BaseRoute]) -> list[str]:
    return [str(getattr(route, "path", "")) for route in routes]


async def test_an_exit_reaches_the_streams_of_its_agent_only(app: Starlette) -> None:
    daemon = daemon_of(app)
    mine, theirs = EventQueue(), EventQueue()
    async with app.router.lifespan_context(app):
        daemon.queues |= {("agent-a", mine), ("agent-b", theirs)}
        result = await daemon.tools["exec"].call({"command": "exit 3"}, "agent-a")
        await asyncio.wait_for(mine.wakeup.wait(), 30)
        kind, event = mine.items[0]
        assert kind == "exit" and event["sessionId"] == result.data["sessionId"] and event["exitCode"] == 3
        assert not theirs.items
    assert daemon.closing.is_set()  # every stream was told to end


async def test_the_daemons_own_tasks_end_with_it(app: Starlette) -> None:
    daemon = daemon_of(app)
    started = asyncio.Event()
    ended: list[bool] = []

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(True)

    async with app.router.lifespan_context(app):
        daemon.spawn(forever())
        await started.wait()
    assert ended == [True]


async def test_the_app_is_built_on_one_daemon(app: Starlette, tmp_path: Path) -> None:
    daemon = daemon_of(app)
    assert isinstance(daemon, Daemon)
    assert daemon.audit_file == audit_file(daemon.settings)  # what the console reads, given, not looked up
    rest = paths(Rest(daemon).routes())
    assert {"/v1/tools", "/v1/tools/{name:path}", "/v1/events", "/v1/approvals", "/v1/proc"} <= set(rest)
    served = paths(app.routes)
    assert set(rest) <= set(served) and "/mcp" in served
    document = build_openapi(list(daemon.tools.values()), "9.9")
    assert document["info"]["version"] == "9.9"
    assert {f"/v1/tools/{name}" for name in daemon.tools} <= document["paths"].keys()


async def test_a_call_served_without_the_router_is_the_one_the_router_would_serve(app: Starlette) -> None:
    # The auth middleware serves an agent's REST tool calls and MCP POSTs itself (app.py's
    # call_routes): for every path it takes, the router's first full match is the same app with
    # the same path parameters; every other path (a line feed, a trailing slash) is the router's.
    from starlette.routing import Match

    (auth,) = app.user_middleware
    calls = auth.kwargs["calls"]
    taken = ["/mcp", "/v1/tools/exec", "/v1/tools/process.logs", "/v1/tools/a/b", "/v1/tools/", "/v1/tools/%0A"]
    left = ["/mcp/", "/v1/tools", "/v1/toolsx", "/v1/tools/exec\n", "/mcp\n", "/v1/sessions", "/console/api/login"]
    for path in taken + left:
        scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": []}
        found = calls(dict(scope))
        assert (found is not None) == (path in taken), path
        if found is None:
            continue
        ours = dict(scope)
        calls(ours)
        full = [child for route in app.routes for match, child in [route.matches(dict(scope))] if match is Match.FULL]
        assert full, path
        assert full[0]["endpoint"] is found, path
        assert ours.get("path_params", {}) == full[0]["path_params"], path
    # A root path (a proxy's prefix) is the router's to strip.
    assert calls({"type": "http", "method": "POST", "path": "/p/mcp", "root_path": "/p", "headers": []}) is None
