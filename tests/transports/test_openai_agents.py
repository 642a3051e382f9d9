"""The OpenAI Agents SDK drives `procpilot mcp` as a user configures it: every tool name is one
OpenAI's function names accept, and a call goes through."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

agents_mcp = pytest.importorskip("agents.mcp", reason="the openai-agents package (dev extra) is not installed")

PROCPILOT = str(Path(sys.executable).parent / "procpilot")
OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


async def test_the_agents_sdk_lists_openai_names_and_calls_exec(tmp_path: Path) -> None:
    args = ["mcp", "--agent", "sdk", "--tool-names", "underscore", "--workspace", str(tmp_path)]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PROCPILOT_STATE_DIR": str(tmp_path / "state")}
    params = {"command": PROCPILOT, "args": args, "env": env}
    async with agents_mcp.MCPServerStdio(params=params, client_session_timeout_seconds=30) as server:
        names = [tool.name for tool in await server.list_tools()]
        assert {"exec", "process", "process_run", "process_list"} <= set(names)
        assert all(OPENAI_NAME.match(name) for name in names), names
        result = await server.call_tool("exec", {"command": "echo from-the-sdk"})
        assert not result.is_error
        assert "from-the-sdk" in result.content[0].text
