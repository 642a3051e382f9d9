"""transports/http/mcp_http.py: the daemon's MCP face tells a session's end to its agent's
listeners only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette

from procpilot.config import load_settings
from procpilot.engine.session import ExitInfo
from procpilot.transports.http.app import daemon_of
from procpilot.transports.http.common import current_agent
from procpilot.transports.http.mcp_http import McpFace
from procpilot.transports.serve import daemon_app, make_supervisor
from tests.daemon import TOKENS, daemon_env, write_config


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Starlette]:
    settings = load_settings(write_config(tmp_path, TOKENS), env=daemon_env(tmp_path))
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    async with make_supervisor(settings) as sup, daemon_app(sup, settings) as app:
        yield app


def listen(face: McpFace, agent: str) -> list[Any]:
    heard: list[Any] = []
    token = current_agent.set(agent)  # as the auth middleware sets it for a listen request
    try:
        face.bus.subscribe(heard.append)
    finally:
        current_agent.reset(token)
    return heard


async def test_an_ended_session_is_told_to_its_agents_listeners_only(app: Starlette) -> None:
    daemon = daemon_of(app)
    face = daemon.mcp
    mine, theirs = listen(face, "agent-a"), listen(face, "agent-b")
    ended = asyncio.Event()

    def on_exit(_info: ExitInfo) -> None:
        ended.set()  # registered after the daemon's own: the face has been told by now

    async with app.router.lifespan_context(app):
        remove = daemon.sup.on_exit(on_exit)
        result = await daemon.tools["exec"].call({"command": "true"}, "agent-a")
        await asyncio.wait_for(ended.wait(), 30)
        remove()
    assert [str(event.uri) for event in mine] == [f"proc://{result.data['sessionId']}"]
    assert theirs == []
